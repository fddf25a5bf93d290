#!/usr/bin/env python3
"""Data-parallel scaling report: kiln_ddp_bench's and torch_ddp_anchor.py's JSON files side by side.

    python3 bench/ddp_report.py --kiln one.json two.json --torch t1.json t2.json [--out report.md]

For each workload and per-GPU batch: the best method's samples/s on each side at each world size, the scaling
against the same side's one-GPU figure (N GPUs: samples/s(N) / samples/s(1); ideal N), and kiln
against torch at the same world size (same per-GPU batch, so the same global batch). Then every
row. Throughput figures only (calls back to back), the same method on both sides."""
import argparse
import json


def load(paths, side):
    rows = []
    for p in paths or []:
        with open(p) as f:
            d = json.load(f)
        for r in d["rows"]:
            r["side"] = side
            rows.append(r)
    return rows


def best(rows, side, workload, world):
    """workload: (name, per-GPU batch)"""
    c = [r for r in rows if r["side"] == side and (r["workload"], r.get("batch_per_gpu")) == workload and r["world_size"] == world
         and "samples_per_s" in r]
    return max(c, key=lambda r: r["samples_per_s"]) if c else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", nargs="+", required=True)
    ap.add_argument("--torch", nargs="*")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = load(a.kiln, "kiln") + load(a.torch, "torch")
    worlds = sorted({r["world_size"] for r in rows})
    workloads = list(dict.fromkeys((r["workload"], r.get("batch_per_gpu")) for r in rows if "batch_per_gpu" in r))
    out = []
    head = "| workload | per-GPU batch |"
    for w in worlds:
        head += f" kiln {w} GPU (best) | torch {w} GPU (best) |"
    for w in worlds:
        if w > 1:
            head += f" kiln scaling {w} GPUs | torch scaling {w} GPUs | kiln / torch samples/s, {w} GPUs |"
    out.append(head)
    out.append("|" + "---|" * (head.count("|") - 1))
    for wl in workloads:
        line = f"| {wl[0]} | {wl[1]} |"
        for w in worlds:
            for side in ("kiln", "torch"):
                r = best(rows, side, wl, w)
                line += f" {r['method']} {r['samples_per_s']:.0f}/s ({r['step_us']:.1f} us) |" if r else " - |"
        for w in worlds:
            if w == 1:
                continue
            cells = []
            for side in ("kiln", "torch"):
                r1, rn = best(rows, side, wl, 1), best(rows, side, wl, w)
                cells.append(f"{rn['samples_per_s'] / r1['samples_per_s']:.2f}x" if r1 and rn else "-")
            k, t = best(rows, "kiln", wl, w), best(rows, "torch", wl, w)
            cells.append(f"{k['samples_per_s'] / t['samples_per_s']:.2f}x" if k and t else "-")
            line += " " + " | ".join(cells) + " |"
        out.append(line)
    out.append("")
    out.append("| side | workload | per-GPU batch | method | GPUs | step us (throughput) | latency us | samples/s | TFLOP/s per GPU | peak MiB | first step ms |")
    out.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["workload"], r.get("batch_per_gpu", 0), r["side"], r["method"], r["world_size"])):
        if "error" in r:
            out.append(f"| {r['side']} | {r['workload']} | {r.get('batch_per_gpu', '-')} | {r['method']} | {r['world_size']} | failed: {r['error'][:120]} | | | | | |")
            continue
        out.append(f"| {r['side']} | {r['workload']} | {r['batch_per_gpu']} | {r['method']} | {r['world_size']} | {r['step_us']:.1f} | {r['latency_us']:.1f} | "
                   f"{r['samples_per_s']:.0f} | {r.get('tflops_per_gpu', 0):.1f} | {r['peak_mem_mib']:.1f} | {r['first_step_ms']:.0f} |")
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
