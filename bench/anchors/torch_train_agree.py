#!/usr/bin/env python3
"""kiln's training against PyTorch's, step by step, from the same weights on the same batches.

    python3 bench/anchors/torch_train_agree.py --kiln build/sep/examples/example_train_mlp [--device cpu|cuda]
                                               [--out DIR] [--steps 20]

The seed's regression (Linear(16, 64), ReLU, Linear(64, 1); AdamW lr 1e-3; MSELoss; batch 128).
This script makes the initial weights and the batches with torch (seeded), writes them to
DIR/weights.safetensors and DIR/batches.safetensors, trains torch for --steps steps, then runs
`example_train_mlp --from DIR` (kiln eager and kiln compiled from the same files), which prints its
losses and writes its final parameters to DIR/kiln_final.safetensors. It passes (exit 0) when every
step's loss agrees with torch's within 1e-4 relative (f32, allow_tf32 off) for both kiln methods
and the final parameters within 1e-4 (relative to max(1, |torch's|)); otherwise it prints the
worst step and exits 1. safetensors files are written and read here directly (the format is a
JSON header and raw little-endian data), so only torch is needed.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {torch.float32: "F32"}


def save_st(path, tensors):
    header, blobs, at = {}, [], 0
    for k, t in tensors.items():
        b = bytes(t.detach().to("cpu").contiguous().view(torch.uint8).flatten().tolist())  # no numpy needed
        header[k] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", f"{k}: {v['dtype']}"
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True, help="path of example_train_mlp")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = a.out or tempfile.mkdtemp(prefix="kiln-train-agree-")
    os.makedirs(out, exist_ok=True)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = Regressor()
    w_true = torch.randn(16, 1)
    batches = {}
    for i in range(a.steps):
        x = torch.randn(128, 16)
        batches[f"x{i}"], batches[f"y{i}"] = x, x @ w_true + 0.1 * torch.randn(128, 1)
    save_st(os.path.join(out, "weights.safetensors"), dict(model.state_dict()))
    save_st(os.path.join(out, "batches.safetensors"), batches)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i in range(a.steps):
        opt.zero_grad()
        loss = F.mse_loss(model(batches[f"x{i}"].to(dev)), batches[f"y{i}"].to(dev))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    cmd = [a.kiln, "--from", out] + (["--cuda"] if dev.type == "cuda" else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout, end="")
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        sys.exit(f"torch_train_agree: {' '.join(cmd)} failed ({r.returncode})")
    kiln = {"eager": [], "compiled": []}
    for line in r.stdout.splitlines():
        if line.startswith("step "):
            p = line.split()
            kiln["eager"].append(float(p[4]))
            kiln["compiled"].append(float(p[6]))
    ok = True
    for method, ls in kiln.items():
        if len(ls) != a.steps:
            sys.exit(f"torch_train_agree: kiln printed {len(ls)} {method} losses, expected {a.steps}")
        worst = max(range(a.steps), key=lambda i: abs(ls[i] - losses[i]) / max(abs(losses[i]), 1e-12))
        rel = abs(ls[worst] - losses[worst]) / max(abs(losses[worst]), 1e-12)
        print(f"kiln {method}: worst step {worst}: loss {ls[worst]:.7g} vs torch {losses[worst]:.7g} (relative {rel:.2e})")
        ok = ok and rel <= 1e-4
    final = load_st(os.path.join(out, "kiln_final.safetensors"))
    for k, t in model.state_dict().items():
        d = float(((final[k] - t.cpu()).abs() / t.cpu().abs().clamp(min=1)).max())
        print(f"final {k}: max relative difference {d:.2e}")
        ok = ok and d <= 1e-4
    print(f"torch_train_agree: {'PASSED' if ok else 'FAILED'} ({a.steps} steps, {a.device}, torch {torch.__version__}, files in {out})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
