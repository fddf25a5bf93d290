#!/usr/bin/env python3
"""ONNX Runtime (CPU execution provider) on the ONNX files kiln_bench writes, beside kiln's rows.

    python3 bench/anchors/ort_anchor.py --data /tmp/kiln-bench-data --kiln KILN.json [--threads 1,2] [--out DIR]

kiln_bench (built with ONNX) writes each model row's program as DATA/<name>.onnx (kiln's ONNX
export), its input DATA/<name>.input.npy and eager's output DATA/<name>.output.npy. This script runs
each file in ONNX Runtime with intra_op_num_threads = each thread count (inter-op 1, all graph
optimizations), checks its output against kiln's, and times it as kiln times its CPU rows: one call
at a time, the median of repeats over at least --min-time seconds. It prints (and writes to
DIR/ort.md and DIR/ort.json) ORT's median beside kiln's `onnx_import` row (the same file imported by
kiln::onnx::load) and `compiled` row at the same thread count.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("KILN_BENCH_DATA", "/tmp/kiln-bench-data"))
    ap.add_argument("--kiln", action="append", default=[], help="kiln_bench --json output (CPU rows); may repeat")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        print(f"ort_anchor: {e} (pip install onnxruntime numpy)", file=sys.stderr)
        return 77
    kiln_rows = []
    for path in a.kiln:
        with open(path) as f:
            doc = json.load(f)
        kiln_rows += doc["rows"] if isinstance(doc, dict) else doc

    def kiln_us(name, method, threads):
        for r in kiln_rows:
            if r.get("workload") == name and r.get("method") == method and int(r.get("threads", 0)) == threads and r.get("median_us"):
                return float(r["median_us"])
        return None

    rows = []
    for path in sorted(glob.glob(os.path.join(a.data, "*.onnx"))):
        name = os.path.basename(path)[:-5]
        inp = os.path.join(a.data, name + ".input.npy")
        if not os.path.exists(inp):
            continue
        x = np.load(inp)
        want = np.load(os.path.join(a.data, name + ".output.npy"))
        for t in [int(v) for v in a.threads.split(",")]:
            so = ort.SessionOptions()
            so.intra_op_num_threads = t
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            try:
                s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 (bf16 models: ORT's CPU EP lacks most bf16 kernels)
                rows.append({"workload": name, "threads": t, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                print(f"{name:<16} threads {t}: ORT cannot load it: {str(e)[:120]}")
                continue
            feed = {s.get_inputs()[0].name: x}
            try:
                y = s.run(None, feed)[0]
            except Exception as e:  # noqa: BLE001
                rows.append({"workload": name, "threads": t, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                print(f"{name:<16} threads {t}: ORT cannot run it: {str(e)[:120]}")
                continue
            diff = float(np.max(np.abs(y.astype(np.float64) - want.astype(np.float64))))
            for _ in range(3):
                s.run(None, feed)
            times = []
            start = time.perf_counter()
            while len(times) < 5 or (time.perf_counter() - start < a.min_time and len(times) < 1000):
                t0 = time.perf_counter()
                s.run(None, feed)
                times.append((time.perf_counter() - t0) * 1e6)
            med = statistics.median(times)
            ki, kc = kiln_us(name, "onnx_import", t), kiln_us(name, "compiled", t)
            row = {"workload": name, "threads": t, "ort_median_us": med, "ort_min_us": min(times), "repeats": len(times),
                   "max_abs_diff_vs_kiln": diff, "kiln_onnx_import_us": ki, "kiln_compiled_us": kc,
                   "ort_over_kiln_import": (med / ki) if ki else None}
            rows.append(row)
            ratio = f"{med / ki:6.2f}x" if ki else "   -   "
            print(f"{name:<16} threads {t}: ORT {med:10.1f} us  kiln onnx_import {ki or 0:10.1f} us  compiled {kc or 0:10.1f} us"
                  f"  ORT/kiln {ratio}  max|diff| {diff:.2e}")
    meta = {"onnxruntime": ort.__version__, "numpy": np.__version__, "data": a.data, "min_time_s": a.min_time}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ort.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(a.out, "ort.md"), "w") as f:
            f.write(f"ONNX Runtime {ort.__version__} CPU EP vs kiln on the same ONNX files (median us per call)\n\n")
            f.write("| model | threads | ORT | kiln onnx_import | kiln compiled | ORT / kiln import | max abs diff |\n|---|---|---|---|---|---|---|\n")
            for r in rows:
                if "error" in r:
                    f.write(f"| {r['workload']} | {r['threads']} | {r['error'][:80]} | | | | |\n")
                    continue
                ki, kc = r["kiln_onnx_import_us"], r["kiln_compiled_us"]
                f.write(f"| {r['workload']} | {r['threads']} | {r['ort_median_us']:.1f} | {ki or 0:.1f} | {kc or 0:.1f} | "
                        f"{(r['ort_median_us'] / ki) if ki else 0:.2f}x | {r['max_abs_diff_vs_kiln']:.1e} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
