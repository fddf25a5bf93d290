#!/usr/bin/env python3
"""kiln vs PyTorch on the CPU: one markdown table from kiln_bench's CPU rows and the anchor's.

    python3 bench/cpu_report.py --kiln kiln.json --torch torch_t1.json torch_t2.json [--out report.md] [--command CMD]

kiln.json is kiln_bench's list of rows (`--no-gpu --json`); each torch file is
bench/anchors/torch_anchor.py's output (`--device cpu`, one OMP_NUM_THREADS each). Rows are matched
on (workload, threads). Every figure is a median of one run (both sides time each call with a
steady clock around it: latency, calls synchronized by returning). Columns: kiln's eager, fused
(expression templates) and compiled (kiln::compile, generated C++), the hand-written xsimd loop of
bench/hand_cpu.hpp where the workload has one, torch eager and torch.compile (Inductor's C++), then
torch.compile's time over kiln compiled's (above 1: kiln is faster), kiln compiled over fused and
over the hand loop (below 1: compiled is faster), and kiln compiled's share of the copy rate (the
memcpy row of the same kiln_bench run, at the same threads) where the row has a byte count.
"""
from __future__ import annotations

import argparse
import json
import sys


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"cpu_report: cannot read {path}: {e}", file=sys.stderr)
        return [], {}
    return (d.get("rows", []), d.get("meta", {})) if isinstance(d, dict) else (d, {})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kiln", required=True)
    p.add_argument("--torch", nargs="*", default=[])
    p.add_argument("--out")
    p.add_argument("--command", default="")
    a = p.parse_args(argv)

    krows, _ = load(a.kiln)
    k = {(r["workload"], r["threads"], r["method"]): r for r in krows if r.get("device") == "cpu" and "median_us" in r}
    t, tmeta = {}, {}
    for f in a.torch:
        rows, meta = load(f)
        tmeta = tmeta or meta
        for r in rows:
            if r.get("ok") and "median_us" in r:
                t[(r["workload"], r["threads"], r["method"])] = r
    copy = {th: r for (w, th, m), r in k.items() if w == "copy"}

    order = []
    for (w, th, _) in k:  # the rows kiln ran (the anchor's filter may match more)
        if w != "copy" and (w, th) not in order:
            order.append((w, th))
    kw = [w for (w, _, _) in k]
    order.sort(key=lambda x: (kw.index(x[0]), x[1]))

    def us(d, key):
        r = d.get(key)
        return r["median_us"] if r else None

    def fmt(v):
        if v is None:
            return "-"
        return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"

    def ratio(a_, b_, suffix=""):
        return f"{a_ / b_:.2f}{suffix}" if a_ and b_ else "-"

    out = []
    out.append("# kiln vs PyTorch on the CPU")
    out.append("")
    if a.command:
        out.append(f"Command: `{a.command}`")
    if tmeta:
        out.append(f"torch {tmeta.get('torch', '?')} on {tmeta.get('cpu', '?')}; {tmeta.get('date', '')}")
    out.append("Medians of one run; time per call. `tc / kc`: torch.compile's time over kiln compiled's (above 1: kiln "
               "faster). `kc / fused`, `kc / hand`: kiln compiled over kiln fused and over the hand-written xsimd loop "
               "(at or below 1: the targets). `% copy`: kiln compiled's bytes per second over the memcpy row's.")
    out.append("")
    out.append("| workload | threads | kiln eager | kiln fused | kiln compiled | hand xsimd | torch eager | torch.compile | tc / kc | kc / fused | kc / hand | % copy |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ahead = behind = 0
    for w, th in order:
        ke, kf, kc = us(k, (w, th, "eager")), us(k, (w, th, "fused")), us(k, (w, th, "compiled"))
        h = us(k, (w, th, "hand"))
        te, tc = us(t, (w, th, "eager")), us(t, (w, th, "compile"))
        pct = "-"
        r = k.get((w, th, "compiled"))
        if r and r.get("gbps") and th in copy and copy[th].get("gbps"):
            pct = f"{100 * r['gbps'] / copy[th]['gbps']:.0f}%"
        if kc and tc:
            ahead, behind = ahead + (tc > kc), behind + (tc <= kc)
        out.append(f"| {w} | {th} | {fmt(ke)} | {fmt(kf)} | {fmt(kc)} | {fmt(h)} | {fmt(te)} | {fmt(tc)} | "
                   f"{ratio(tc, kc, 'x')} | {ratio(kc, kf)} | {ratio(kc, h)} | {pct} |")
    out.append("")
    out.append(f"kiln compiled ahead of torch.compile on {ahead} of {ahead + behind} rows both ran.")
    for th, r in sorted(copy.items()):
        out.append(f"Copy rate (kiln_bench memcpy, {th} thread{'s' if th > 1 else ''}): {r.get('gbps', 0):.1f} GB/s.")
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0 if k else 1


if __name__ == "__main__":
    sys.exit(main())
