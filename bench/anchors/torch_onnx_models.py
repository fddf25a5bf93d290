#!/usr/bin/env python3
"""Real ONNX models for kiln's ONNX import: PyTorch's exporter (torch.onnx.export(dynamo=True), a
dynamic batch) on the shapes of kiln_bench's model rows, with each model's input and PyTorch's
output as .npy, and PyTorch's own times on the same input (eager and torch.compile: latency, each call
synchronized, and throughput, calls back to back with one synchronize; medians).

    python3 bench/anchors/torch_onnx_models.py OUT_DIR [--device cuda|cpu] [--models mlp_f32,bert_layer_f32,resnet18]

Writes OUT_DIR/<model>.onnx, <model>.input.npy, <model>.torch.npy and OUT_DIR/torch.json. Models:
mlp_f32 (64 x 1024 -> 4096 -> 1024, tanh GELU), bert_layer_f32 (nn.TransformerEncoderLayer 768, 12
heads, 3072, gelu, batch 8 x 128), resnet18 (bench/anchors/torch_anchor.py's, batch 16 x 3 x 224 x 224,
eval mode). f32, TF32 off, as kiln's f32 rows.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def models(names):
    torch.manual_seed(0)
    out = []
    if "mlp_f32" in names:
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4096, 1024))
        out.append(("mlp_f32", m, torch.randn(64, 1024)))
    if "bert_layer_f32" in names:
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
        out.append(("bert_layer_f32", layer, torch.randn(8, 128, 768)))
    if "resnet18" in names:
        from torch_anchor import ResNet18
        out.append(("resnet18", ResNet18(), torch.randn(16, 3, 224, 224)))
    return out


def timings(fn, x, sync):
    for _ in range(3):
        fn(x)
    sync()
    lat = []
    for _ in range(20):
        t0 = time.perf_counter()
        fn(x)
        sync()
        lat.append((time.perf_counter() - t0) * 1e6)
    med = statistics.median(lat)
    thr = []
    n = max(1, int(0.1e6 / med))
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
        sync()
        thr.append((time.perf_counter() - t0) * 1e6 / n)
    return med, statistics.median(thr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="mlp_f32,bert_layer_f32,resnet18")
    ap.add_argument("--tf32", action="store_true", help="TF32 GEMMs and convolutions (torch's default for convolutions)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile's timings")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    rows = []
    batch = torch.export.Dim("batch", min=1, max=4096)
    with torch.no_grad():
        for name, m, x in models(a.models.split(",")):
            m = m.eval()
            path = os.path.join(a.out, name + ".onnx")
            t0 = time.perf_counter()
            torch.onnx.export(m, (x,), path, dynamo=True, dynamic_shapes=({0: batch},), external_data=False, verbose=False)
            export_s = time.perf_counter() - t0
            np.save(os.path.join(a.out, name + ".input.npy"), x.numpy())
            md, xd = m.to(dev), x.to(dev)
            y = md(xd)
            np.save(os.path.join(a.out, name + ".torch.npy"), y.float().cpu().numpy())
            row = {"model": name, "onnx_export_s": export_s, "device": str(dev), "tf32": a.tf32}
            row["eager_latency_us"], row["eager_throughput_us"] = timings(md, xd, sync)
            try:
                if a.no_compile:
                    raise RuntimeError("--no-compile")
                c = torch.compile(md)
                row["compile_latency_us"], row["compile_throughput_us"] = timings(c, xd, sync)
            except Exception as e:  # noqa: BLE001
                row["compile_error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(json.dumps(row))
    with open(os.path.join(a.out, "torch_tf32.json" if a.tf32 else "torch.json"), "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
