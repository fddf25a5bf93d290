#!/usr/bin/env python3
"""The peer of kiln_bench's `export` rows: how long PyTorch takes to export the same models with a
dynamic batch, torch.export.export and torch.onnx.export(dynamo=True), each timed in a fresh
process state for the first export and again (median of --repeats) for later ones.

    python3 bench/anchors/torch_export_time.py [--device cpu|cuda] [--repeats N] [--json OUT]

Models (the shapes of kiln_bench's model rows): mlp_f32 (64 x 1024 -> 4096 -> 1024, tanh GELU),
bert_layer_f32 (nn.TransformerEncoderLayer 768, 12 heads, 3072, batch 8 x 128, gelu),
resnet18 (torchvision's when importable, batch 8 x 3 x 224 x 224). Each export declares the batch
dim dynamic (torch.export.Dim("batch", min=1, max=4096)). Prints one line per (model, exporter)
and writes JSON rows {model, exporter, first_s, median_s, repeats} with --json.
"""
import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def models(device):
    out = []
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4096, 1024))
    out.append(("mlp_f32", mlp, torch.randn(64, 1024)))
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
    out.append(("bert_layer_f32", layer, torch.randn(8, 128, 768)))
    try:
        import torchvision
        out.append(("resnet18", torchvision.models.resnet18(), torch.randn(8, 3, 224, 224)))
    except ImportError:
        print("resnet18: SKIPPED: torchvision is not installed", file=sys.stderr)
    return [(n, m.to(device).eval(), x.to(device)) for n, m, x in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    batch = torch.export.Dim("batch", min=1, max=4096)
    tmp = tempfile.mkdtemp()
    with torch.no_grad():
        for name, m, x in models(a.device):
            arg = list(inspect.signature(m.forward).parameters)[0]  # the forward's first parameter's name

            def export_program():
                return torch.export.export(m, (x,), dynamic_shapes={arg: {0: batch}})

            def export_onnx():
                return torch.onnx.export(m, (x,), os.path.join(tmp, name + ".onnx"), dynamo=True,
                                         dynamic_shapes=({0: batch},), verbose=False)

            for exporter, fn in (("torch.export", export_program), ("torch.onnx.export(dynamo=True)", export_onnx)):
                try:
                    t0 = time.perf_counter()
                    fn()
                    first = time.perf_counter() - t0
                    times = []
                    for _ in range(a.repeats):
                        t0 = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - t0)
                    med = statistics.median(times)
                    print(f"{name:16s} {exporter:32s} first {first:8.3f} s, then median {med:8.3f} s ({a.repeats} repeats)")
                    rows.append({"model": name, "exporter": exporter, "first_s": first, "median_s": med, "repeats": a.repeats,
                                 "device": a.device, "torch": torch.__version__})
                except Exception as e:  # an exporter that fails is reported, not hidden
                    print(f"{name:16s} {exporter:32s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    rows.append({"model": name, "exporter": exporter, "error": f"{type(e).__name__}: {e}"[:500]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
