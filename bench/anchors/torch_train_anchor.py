#!/usr/bin/env python3
"""PyTorch anchor for kiln_bench's training rows: the same training step, timed the same ways.

    python3 bench/anchors/torch_train_anchor.py --json OUT.json [--device cuda|cpu] [--min-time S]

    [--workloads mlp_train,bert_layer_train,resnet18_train]

mlp_train: the bench's MLP (Linear(1024, 4096), GELU(tanh), Linear(4096, 1024)), batch 64, f32
(allow_tf32 off, as kiln's f32 rows), MSE loss against a fixed target, backward, AdamW(lr=1e-4).
bert_layer_train: the bench's BERT layer (torch_anchor.BertLayer: hidden 768, 12 heads, FFN 3072,
batch 8, seq 128) with f32 weights under torch.autocast(bfloat16) for forward and loss, MSE loss
in f32 against a fixed target, AdamW(lr=1e-4) on the f32 weights.
resnet18_train: torch_anchor.ResNet18 in training mode, batch 16 at 224x224, f32 with TF32
convolutions (torch's default: cudnn.allow_tf32 on, matmul.allow_tf32 off), cross-entropy over
1000 classes, SGD(lr=0.01, momentum=0.9).
Methods:
  eager       the step in plain PyTorch, the optimizer's default (foreach) implementation
  compile     torch.compile of the model and loss (AOTAutograd compiles forward and backward),
              the optimizer with fused=True
  compile_ro  the same with mode="reduce-overhead" (CUDA graphs), fused=True
Each method trains its own copy from the same seed; the first step's loss of each is checked
against eager's. Timing as kiln_bench's rows: latency_us (= median_us: CUDA events around each
call, synchronized after each), throughput_us (calls back to back between two events, >= 0.1 s a
run, median of 5 runs, per call), host_us; peak_mem_mib: torch.cuda.max_memory_allocated over the
timed calls (the allocator's blocks), peak_requested_mib: memory_stats' requested_bytes.all.peak
(what the tensors asked for: kiln_bench's peak_requested_mib), peak_reserved_mib. Under
reduce-overhead the CUDA graph's pool is allocated before the timed calls and replays allocate
nothing, so these peaks leave out the step's own memory there: compare the compile rows. The file is {"meta": {...}, "rows": [...]} like torch_anchor.py's.
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
from torch_anchor import BertLayer, ResNet18, Timer  # noqa: E402  (the same modules and timing as the inference rows)


class MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def make(name, dev, fused, wrap=lambda m: m, batch=0):
    """(model, optimizer, loss(x, y), x, y, flops, math, autocast) of a training workload; the loss
    calls wrap(model) (torch_ddp_anchor.py wraps it in DistributedDataParallel); batch > 0 replaces
    the workload's batch (as kiln's make_trainer, bench/train_workloads.hpp)."""
    def pick(d):
        return batch if batch > 0 else d

    torch.manual_seed(7)
    g = torch.Generator(device="cpu").manual_seed(7)
    fused = fused if dev.type == "cuda" else None
    if name == "mlp_train":
        model = MLP(1024, 4096).to(dev)
        B = pick(64)
        x = torch.randn((B, 1024), generator=g).to(dev)
        y = torch.randn((B, 1024), generator=g).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
        net = wrap(model)
        return model, opt, lambda inp, tgt: F.mse_loss(net(inp), tgt), x, y, 3 * 2.0 * B * (1024 * 4096 * 2), "f32 (no TF32)", False
    if name == "bert_layer_train":
        B, S, E, H, Fh = pick(8), 128, 768, 12, 3072
        model = BertLayer(E, H, Fh, eps=1e-5).to(dev)
        x = torch.randn((B, S, E), generator=g).to(dev)
        y = torch.randn((B, S, E), generator=g).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
        flops = 3 * (2.0 * B * S * (E * 3 * E + E * E + 2 * E * Fh) + 2 * 2 * B * H * S * S * (E // H))
        net = wrap(model)
        return (model, opt, lambda inp, tgt: F.mse_loss(net(inp).float(), tgt), x, y, flops,
                "bf16 compute (autocast), f32 master weights and AdamW state", True)
    if name == "resnet18_train":
        model = ResNet18().to(dev).train()
        B = pick(16)
        x = torch.randn((B, 3, 224, 224), generator=g).to(dev)
        y = torch.randint(0, 1000, (B,), generator=g).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=fused)
        net = wrap(model)
        return (model, opt, lambda inp, tgt: F.cross_entropy(net(inp), tgt), x, y, 3 * 2.0 * 1814073344 * B,
                "f32, TF32 convolutions (torch's default)", False)
    raise ValueError(f"no training workload {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--workloads", default="mlp_train,bert_layer_train,resnet18_train")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    rows = []
    for name in a.workloads.split(","):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = name == "resnet18_train"
        ref = None
        for method in ("eager", "compile", "compile_ro"):
            if method == "compile_ro" and not cuda:
                continue
            torch._dynamo.reset()
            model, opt, loss_fn, x, y, flops, math_mode, autocast = make(name, dev, fused=method != "eager")
            if method != "eager":
                loss_fn = torch.compile(loss_fn, mode="reduce-overhead" if method == "compile_ro" else None)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = loss_fn(x, y)
                loss.backward()
                opt.step()
                return loss.detach()

            sync()
            t0 = time.perf_counter()
            first = step()
            sync()
            first_us = (time.perf_counter() - t0) * 1e6
            row = {"workload": name, "method": method, "device": str(dev), "threads": 0 if cuda else torch.get_num_threads(),
                   "math": math_mode, "flops": flops, "first_call_us": first_us, "loss0": float(first)}
            if ref is None:
                ref = float(first)
            row["ok"] = math.isclose(float(first), ref, rel_tol=1e-3)
            for _ in range(3):
                step()
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            timer = Timer(dev, a.min_time, 20 if cuda else 3)
            times, host = timer.repeats(step)
            row.update(median_us=statistics.median(times), latency_us=statistics.median(times), min_us=min(times), repeats=len(times),
                       host_us=statistics.median(host))
            if cuda:
                row["throughput_us"] = timer.throughput(step, row["median_us"])
                row["peak_mem_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
                stats = torch.cuda.memory_stats(dev)
                row["peak_requested_mib"] = stats.get("requested_bytes.all.peak", 0) / 2**20
                row["peak_reserved_mib"] = torch.cuda.max_memory_reserved(dev) / 2**20
            rate = row.get("throughput_us", row["median_us"])
            row["tflops"] = flops / (rate * 1e6)
            rows.append(row)
            print(f"[torch_train_anchor] {name:<16} {method:<10} latency {row['median_us']:9.1f} us  thru {row.get('throughput_us', 0):9.1f} us  "
                  f"host {row['host_us']:8.1f}  first {first_us / 1e3:8.1f} ms  peak {row.get('peak_mem_mib', 0):.1f} MiB "
                  f"(requested {row.get('peak_requested_mib', 0):.1f}, reserved {row.get('peak_reserved_mib', 0):.1f})  ok={row['ok']}",
                  file=sys.stderr, flush=True)
    meta = {"tool": "bench/anchors/torch_train_anchor.py", "argv": sys.argv, "torch": torch.__version__,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if cuda else None}
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
