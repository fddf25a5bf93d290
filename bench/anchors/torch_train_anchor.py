#!/usr/bin/env python3
"""PyTorch anchor for kiln_bench's training rows: the same training step, timed the same ways.

    python3 bench/anchors/torch_train_anchor.py --json OUT.json [--device cuda|cpu] [--min-time S]

mlp_train: the bench's MLP (Linear(1024, 4096), GELU(tanh), Linear(4096, 1024)), batch 64, f32
(allow_tf32 off, as kiln's f32 rows), MSE loss against a fixed target, backward, AdamW(lr=1e-4).
Methods:
  eager       the step in plain PyTorch, AdamW's default (foreach) implementation
  compile     torch.compile of the model and loss (AOTAutograd compiles forward and backward),
              AdamW(fused=True)
  compile_ro  the same with mode="reduce-overhead" (CUDA graphs), AdamW(fused=True)
Each method trains its own copy from the same seed; the first step's loss of each is checked
against eager's. Timing as kiln_bench's rows: latency_us (= median_us: CUDA events around each
call, synchronized after each), throughput_us (calls back to back between two events, >= 0.1 s a
run, median of 5 runs, per call), host_us; peak_mem_mib: torch.cuda.max_memory_allocated over the
timed calls. The file is {"meta": {...}, "rows": [...]} like torch_anchor.py's.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import sys
import tempfile
import time

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-train-anchor-inductor-")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_anchor import Timer  # noqa: E402  (the same timing as every other anchor row)


class MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def make(dev, fused):
    torch.manual_seed(7)
    model = MLP(1024, 4096).to(dev)
    g = torch.Generator(device="cpu").manual_seed(7)
    x = torch.randn((64, 1024), generator=g).to(dev)
    y = torch.randn((64, 1024), generator=g).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused if dev.type == "cuda" else None)
    return model, opt, x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--min-time", type=float, default=0.5)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    rows, ref = [], None
    flops = 3 * 2.0 * 64 * (1024 * 4096 * 2)
    for method in ("eager", "compile", "compile_ro"):
        torch._dynamo.reset()
        model, opt, x, y = make(dev, fused=method != "eager")
        loss_fn = lambda inp, tgt: F.mse_loss(model(inp), tgt)  # noqa: E731
        if method != "eager":
            loss_fn = torch.compile(loss_fn, mode="reduce-overhead" if method == "compile_ro" else None)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            return loss.detach()

        sync()
        t0 = time.perf_counter()
        first = step()
        sync()
        first_us = (time.perf_counter() - t0) * 1e6
        row = {"workload": "mlp_train", "method": method, "device": str(dev), "threads": 0 if cuda else torch.get_num_threads(),
               "math": "f32 (no TF32)", "flops": flops, "first_call_us": first_us, "loss0": float(first)}
        if ref is None:
            ref = float(first)
        row["ok"] = math.isclose(float(first), ref, rel_tol=1e-4)
        for _ in range(3):
            step()
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        timer = Timer(dev, a.min_time, 20)
        times, host = timer.repeats(step)
        row.update(median_us=statistics.median(times), latency_us=statistics.median(times), min_us=min(times), repeats=len(times),
                   host_us=statistics.median(host))
        if cuda:
            row["throughput_us"] = timer.throughput(step, row["median_us"])
            row["peak_mem_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        rate = row.get("throughput_us", row["median_us"])
        row["tflops"] = flops / (rate * 1e6)
        rows.append(row)
        print(f"[torch_train_anchor] {method:<10} latency {row['median_us']:9.1f} us  thru {row.get('throughput_us', 0):9.1f} us  "
              f"host {row['host_us']:8.1f}  first {first_us / 1e3:8.1f} ms  peak {row.get('peak_mem_mib', 0):.0f} MiB  ok={row['ok']}",
              file=sys.stderr, flush=True)
    meta = {"tool": "bench/anchors/torch_train_anchor.py", "argv": sys.argv, "torch": torch.__version__,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if cuda else None}
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
