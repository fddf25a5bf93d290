#!/usr/bin/env python3
"""Reads tools/cupti_trace.cpp's CSV files and sums up one CUDA graph's replays (a compiled
training step under reduce_overhead): per replay the span, the main stream's busy time and gaps,
the communication kernels (NCCL) and the compute that ran beside them. Prints the median replay's
summary per file, and with --list DIR writes that replay's kernels (order, stream, start, duration,
name) to DIR/<file>.steps.tsv for side-by-side comparisons of two runs.

    python3 tools/cupti_timeline.py [--list DIR] trace.*.csv
"""
import argparse
import csv
import os
import statistics
import sys
from collections import defaultdict


def union(iv):
    total, end = 0, None
    for s, e in sorted(iv):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def short(name):
    n = name.split("(")[0]
    return n[:70]


def analyse(path, list_dir):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["graph"]), int(r["node"]), int(r["start"]), int(r["end"]), int(r["stream"]), r["name"], int(r["dev"])))
    if not rows:
        print(f"{path}: no records")
        return
    by_graph = defaultdict(list)
    for r in rows:
        if r[0]:
            by_graph[r[0]].append(r)
    if not by_graph:
        print(f"{path}: {len(rows)} records, none in a CUDA graph")
        return
    # the step: the graph with the most records
    gid, recs = max(by_graph.items(), key=lambda kv: len(kv[1]))
    recs.sort(key=lambda r: r[2])
    nodes = {r[1] for r in recs}
    # replays: a replay holds each node once; a new replay starts when a node repeats
    replays, cur, seen = [], [], set()
    for r in recs:
        if r[1] in seen:
            replays.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r[1])
    if cur:
        replays.append(cur)
    replays = [p for p in replays if len(p) == len(nodes)]
    if not replays:
        print(f"{path}: graph {gid}: no complete replay")
        return
    later = replays[len(replays) // 2:]
    stats = []
    for p in later:
        t0 = min(r[2] for r in p)
        t1 = max(r[3] for r in p)
        comm = [r for r in p if "nccl" in r[5].lower()]
        comp = [r for r in p if "nccl" not in r[5].lower()]
        busy = union([(r[2], r[3]) for r in comp])
        cov = 0
        comm_iv = [(r[2], r[3]) for r in comm]
        for r in comp:  # compute time that ran while a communication kernel ran
            for s, e in comm_iv:
                cov += max(0, min(e, r[3]) - max(s, r[2]))
        stats.append((t1 - t0, busy, comm, comp, t0, cov))
    stats.sort(key=lambda s: s[0])
    span, busy, comm, comp, t0, cov = stats[len(stats) // 2]
    streams = defaultdict(int)
    for r in comp:
        streams[r[4]] += 1
    print(f"== {os.path.basename(path)}: graph {gid}, {len(nodes)} nodes, {len(replays)} replays (median of the last {len(later)})")
    print(f"   span {span / 1e3:.1f} us; compute busy {busy / 1e3:.1f} us (sum of kernels {sum(r[3] - r[2] for r in comp) / 1e3:.1f}); "
          f"gaps {(span - busy) / 1e3:.1f} us; compute kernels {len(comp)} on streams {dict(streams)}")
    spans = [s[0] / 1e3 for s in stats]
    print(f"   spans: min {spans[0]:.1f} median {statistics.median(spans):.1f} max {spans[-1]:.1f} us")
    if comm:
        last_comp = max(r[3] for r in comp)
        print(f"   communication: {len(comm)} kernels, {sum(r[3] - r[2] for r in comm) / 1e3:.1f} us in all; compute beside them {cov / 1e3:.1f} us; "
              f"last compute ends at {(last_comp - t0) / 1e3:.1f} us")
        for r in comm:
            # what the main stream did while this ran
            beside = union([(max(x[2], r[2]), min(x[3], r[3])) for x in comp if x[3] > r[2] and x[2] < r[3]])
            print(f"     {short(r[5])[:40]:40s} start {(r[2] - t0) / 1e3:8.1f} end {(r[3] - t0) / 1e3:8.1f} ({(r[3] - r[2]) / 1e3:.1f} us; "
                  f"compute busy beside it {beside / 1e3:.1f} us)")
    top = defaultdict(lambda: [0, 0])
    for r in comp:
        top[short(r[5])][0] += r[3] - r[2]
        top[short(r[5])][1] += 1
    print("   largest kernel classes (us, count):")
    for n, (d, c) in sorted(top.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"     {d / 1e3:8.1f} {c:4d}  {n}")
    if list_dir:
        os.makedirs(list_dir, exist_ok=True)
        out = os.path.join(list_dir, os.path.basename(path) + ".steps.tsv")
        with open(out, "w") as f:
            f.write("i\tstream\tstart_us\tdur_us\tname\n")
            p = sorted(comm + comp, key=lambda r: r[2])
            for i, r in enumerate(p):
                f.write(f"{i}\t{r[4]}\t{(r[2] - t0) / 1e3:.2f}\t{(r[3] - r[2]) / 1e3:.2f}\t{short(r[5])}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    for p in a.files:
        analyse(p, a.list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
