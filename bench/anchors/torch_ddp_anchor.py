#!/usr/bin/env python3
"""PyTorch's side of kiln_ddp_bench: the same training steps, data-parallel, timed the same way.

    torchrun --nproc_per_node N bench/anchors/torch_ddp_anchor.py --json OUT.json [--min-time S]
        [--workloads mlp_train,bert_layer_train,resnet18_train] [--methods compile,compile_ro,eager] [--batch N]

The workloads are torch_train_anchor.py's (make(): the same models, per-GPU batches, losses,
optimizers with fused=True, math modes). With one process the model is used as is; with several it
is wrapped in DistributedDataParallel (NCCL, torch's default 25 MB buckets, gradients all-reduced
during backward) and the loss is torch.compile'd around it (torch.compile splits the graph at DDP's
bucket boundaries, DDPOptimizer, so communication overlaps the backward).
Methods: eager (DDP without compile), compile (torch.compile, default mode), compile_ro
(mode="reduce-overhead"). Timing as kiln_ddp_bench's, the same step counts on every rank:
latency = CUDA events around each step, synchronized (20 steps, median); throughput = n steps back
to back between two events after a barrier, n from rank 0's latency so a run lasts >= min-time,
median of 5 runs, per step. Rank 0 writes {"meta", "rows"} with step_us, latency_us,
samples_per_s (all ranks), peak_mem_mib and first_step_ms.
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
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-ddp-anchor-inductor-")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_anchor import make  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--workloads", default="mlp_train,bert_layer_train,resnet18_train")
    ap.add_argument("--methods", default="compile,compile_ro")
    ap.add_argument("--batch", type=int, default=0, help="per-GPU batch (0: the workload's)")
    a = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    if world > 1:
        dist.init_process_group("nccl", device_id=dev)

    def barrier():
        torch.cuda.synchronize(dev)
        if world > 1:
            dist.barrier()

    rows = []
    for name in a.workloads.split(","):
        for method in a.methods.split(","):
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = name == "resnet18_train"
            torch._dynamo.reset()
            wrap = (lambda m: DDP(m, device_ids=[local])) if world > 1 else (lambda m: m)
            row = {"workload": name, "method": method, "world_size": world}
            try:
                model, opt, loss_fn, x, y, flops, math_mode, autocast = make(name, dev, fused=True, wrap=wrap, batch=a.batch)
                row.update(math=math_mode, batch_per_gpu=int(x.shape[0]))
                if method != "eager":
                    loss_fn = torch.compile(loss_fn, mode="reduce-overhead" if method == "compile_ro" else None)

                def step():
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                        loss = loss_fn(x, y)
                    loss.backward()
                    opt.step()
                    return loss.detach()

                barrier()
                t0 = time.perf_counter()
                row["loss_first"] = float(step())
                row["first_step_ms"] = (time.perf_counter() - t0) * 1e3
                for _ in range(3):
                    step()
                barrier()
                torch.cuda.reset_peak_memory_stats(dev)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                lat = []
                for _ in range(20):
                    e0.record()
                    step()
                    e1.record()
                    e1.synchronize()
                    lat.append(e0.elapsed_time(e1) * 1e3)
                row["latency_us"] = statistics.median(lat)
                n = torch.tensor([math.ceil(a.min_time * 1e6 / max(1.0, row["latency_us"]))], dtype=torch.float64, device=dev)
                if world > 1:
                    dist.broadcast(n, 0)
                steps = max(3, int(n.item()))
                per = []
                for _ in range(5):
                    barrier()
                    e0.record()
                    for _ in range(steps):
                        loss = step()
                    e1.record()
                    e1.synchronize()
                    per.append(e0.elapsed_time(e1) * 1e3 / steps)
                row["step_us"] = statistics.median(per)
                row["loss_last"] = float(loss)
                row["samples_per_s"] = row["batch_per_gpu"] * world / (row["step_us"] * 1e-6)
                row["tflops_per_gpu"] = flops / (row["step_us"] * 1e6)
                row["peak_mem_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
            except Exception as e:  # noqa: BLE001  (a method torch cannot run here is reported, not fatal)
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            if rank == 0:
                if "error" in row:
                    print(f"[torch_ddp_anchor] {name:<16} {method:<10} {world} GPU: {row['error']}", file=sys.stderr, flush=True)
                else:
                    print(f"[torch_ddp_anchor] {name:<16} {method:<10} {world} GPU: step {row['step_us']:9.1f} us (latency {row['latency_us']:9.1f}), "
                          f"{row['samples_per_s']:9.0f} samples/s, peak {row['peak_mem_mib']:.0f} MiB, first {row['first_step_ms']:.0f} ms",
                          file=sys.stderr, flush=True)
    if rank == 0:
        meta = {"tool": "bench/anchors/torch_ddp_anchor.py", "argv": sys.argv, "torch": torch.__version__, "world_size": world,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpu": torch.cuda.get_device_name(dev),
                "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
