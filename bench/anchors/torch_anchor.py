#!/usr/bin/env python3
"""PyTorch anchor for kiln_bench: the same GPU workloads, shapes and dtypes, timed in PyTorch eager,
torch.compile (default mode) and torch.compile(mode="reduce-overhead") on the same device.

    python3 bench/anchors/torch_anchor.py --json OUT.json [--filter SUBSTR] [--device cuda|cpu]
                                          [--quick] [--tiny] [--min-time S] [--min-repeats N]

Rows follow kiln_bench's JSON (workload, method, device, threads, median_us, min_us, first_call_us,
repeats, bytes, gbps, pct_copy, speedup_vs_eager) plus flops, tflops, math, ok, max_err, tol,
error. The file is {"meta": {...}, "rows": [...]}; bench/report.py reads it next to kiln's list.

Timing matches kiln_bench's GPU rows: after the first call (for compile modes: the compilation,
into a fresh TORCHINDUCTOR_CACHE_DIR) and a warm-up of >= 3 calls, three measures per row:
latency_us (= median_us): each repeat is CUDA event record, call, event record, event synchronize,
so host launch cost counts where the GPU waits for it; repeats go on for --min-time seconds and at
least --min-repeats calls (at most 5000); host_us: the host's wall time inside the call in those
repeats (median); throughput_us: n calls back to back between two events and one synchronize, n
chosen from the latency so that a run lasts >= --throughput-time seconds, median of 5 runs, per
call. gbps and tflops are by throughput. Every method's output is checked against eager first; a
mismatch is reported in its row ("ok": false) and that method is not timed. For compile_ro the
inputs are marked static (torch._dynamo.mark_static_address), as they are the same buffers on every
call; --ro-copy-inputs leaves them unmarked, and CUDA graphs copy them in on every call.

Rows "copy" (a 1 GiB f32 clone, read + write counted), "gemm_bf16" and "gemm_f32" (8192^3 matmul,
f32 with torch's default allow_tf32=False) give the roofline that report.py measures against.

--tiny shrinks every shape (a smoke test, e.g. with --device cpu); its rows are not comparable to
kiln's and meta.tiny says so.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import traceback

# A fresh inductor cache, so compile-mode first calls measure cold compiles (like kiln_bench's
# fresh NVRTC cache dir). Must be set before torch/inductor reads it.
_CACHE_DIR_GIVEN = "TORCHINDUCTOR_CACHE_DIR" in os.environ
if not _CACHE_DIR_GIVEN:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-anchor-inductor-")

import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# torch's f32 matmul default (no TF32) is kept on purpose: the f32 rows say "f32 (no TF32)"
warnings.filterwarnings("ignore", message=".*TensorFloat32 tensor cores.*")

METHODS = ("eager", "compile", "compile_ro")
MODES = {"compile": None, "compile_ro": "reduce-overhead"}
MATH_F32 = "f32 (no TF32)"
MATH_BF16 = "bf16"
MATH_TF32_CONV = "f32 convs TF32 (torch default)"


def log(msg: str) -> None:
    print(f"[torch_anchor] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# workloads: each builder returns a dict
#   fn      callable(*inputs) -> Tensor (a function or an nn.Module)
#   inputs  tuple of tensors
#   bytes   least memory traffic (inputs read once, outputs written once), as kiln_bench counts
#   flops   arithmetic of the GEMM-heavy workloads (0 for the bandwidth-bound ones)
#   math    the math mode of the row
#   tol     (rtol, atol relative to max(1, max |eager output|))

TOL_F32_EW = (1e-4, 1e-5)
TOL_F32_GEMM = (1e-3, 1e-3)
TOL_BF16 = (3e-2, 3e-2)
TOL_TF32 = (2e-2, 2e-2)


def _gen(device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _randn(shape, device, g, dtype=torch.float32):
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def chain_fn(x):
    return torch.relu(x * 1.5 + 0.5) * torch.sigmoid(x) - torch.tanh(x * 0.1) + torch.exp(-x * x)


def bias_gelu_fn(x, b):
    return F.gelu(x + b, approximate="tanh")


def softmax_fn(x):
    return torch.softmax(x, dim=-1)


def rowsum_fn(x):
    return torch.sum(x, dim=-1)


def colsum_fn(x):
    return torch.sum(x * x, dim=0)


def layernorm_fn(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def sincos_fn(x):
    return torch.sin(x) + torch.cos(x)


BS_R, BS_VOL = 0.02, 0.3


def blackscholes_fn(s, k, t):
    """A European call and put from one formula: two outputs sharing d1, d2 and the discount."""
    def ncdf(z):
        return 0.5 * (1.0 + torch.erf(z * 0.7071067811865476))

    d1 = (torch.log(s / k) + t * (BS_R + 0.5 * BS_VOL * BS_VOL)) / (torch.sqrt(t) * BS_VOL)
    d2 = d1 - torch.sqrt(t) * BS_VOL
    disc = k * torch.exp(t * -BS_R)
    return s * ncdf(d1) - disc * ncdf(d2), disc * ncdf(-d2) - s * ncdf(-d1)


def numpy_fn(X, Y):
    """The seed's numpy definition, written as numpy would: the (n, m, m) outer product is formed
    (in eager) and summed; torch.compile may or may not factor it."""

    def norm(A):
        mu = A.mean(0, keepdim=True)
        sd = A.std(0, correction=0, keepdim=True)
        sd = torch.where(sd == 0, torch.ones_like(sd), sd)
        return (A - mu) / sd

    Xn, Yn = norm(X), norm(Y)
    r = (Xn[:, :, None] * Yn[:, None, :]).sum((1, 2))
    return torch.exp(torch.clip(r, -1.0, 1.0)) + 0.001 * (Xn**2 + Yn**2).sum(1)


class MLP(nn.Module):
    def __init__(self, d_in, d_hidden):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_in)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class BertLayer(nn.Module):
    """Post-LN BERT encoder layer: fused QKV Linear, SDPA (no mask, no dropout), output projection,
    residual + LayerNorm, GELU(tanh) FFN, residual + LayerNorm. LayerNorm eps 1e-5."""

    def __init__(self, hidden, heads, ffn, eps=1e-5):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x):
        B, S, H = x.shape
        d = H // self.heads
        qkv = self.qkv(x).view(B, S, 3, self.heads, d).permute(2, 0, 3, 1, 4)  # (3, B, heads, S, d)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(d), no mask, no dropout
        a = a.transpose(1, 2).reshape(B, S, H)
        h = self.ln1(x + self.proj(a))
        f = self.fc2(F.gelu(self.fc1(h), approximate="tanh"))
        return self.ln2(h + f)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + idt)


class ResNet18(nn.Module):
    """ResNet-18 written out (no torchvision): conv7x7/2 64, BN, ReLU, maxpool3x3/2, 4 stages of two
    BasicBlocks (64, 128, 256, 512 channels; 1x1 conv + BN downsample where stride 2), global
    average pool, fc 512 -> 1000."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's init, plus non-trivial BN running statistics
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.weight.uniform_(0.5, 1.0)
                    m.bias.normal_(0.0, 0.1)
                    m.running_mean.normal_(0.0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Linears(nn.Module):
    """bert-base's four weights applied to the same rows (kiln_bench's linears_m* rows)."""
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(768, 2304), nn.Linear(768, 768)
        self.up, self.down = nn.Linear(768, 3072), nn.Linear(3072, 768)

    def forward(self, x):
        return self.qkv(x), self.out(x), self.down(F.gelu(self.up(x)))


def conv_fc_macs(model, inputs):
    """Multiply-accumulates of every Conv2d and Linear in one forward, counted from the shapes:
    conv: out.numel() * (cin / groups) * kh * kw; linear: out.numel() * in_features."""
    total = [0]

    def conv_hook(m, _inp, out):
        total[0] += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def fc_hook(m, _inp, out):
        total[0] += out.numel() * m.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(fc_hook))
    try:
        model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


def _module(model, device, dtype):
    return model.to(device=device, dtype=dtype).eval()


def make_workload(name, device, tiny):
    """Builds one workload (inputs made with a fixed seed per workload, as kiln_bench does). On the
    CPU the shapes are kiln_bench's CPU rows' (chain16M / chain1M, bias_gelu and layernorm 8192 x
    1024, softmax 4096 x 1024, blackscholes 4M), on the GPU its GPU rows'."""
    dev = device
    cpu = torch.device(device).type == "cpu"
    if name in ("chain16M", "chain1M"):
        n = (1 << 16) if tiny else (16 << 20 if name == "chain16M" else 1 << 20)
        g = _gen(dev, 1)
        x = _randn((n,), dev, g) * 2.0
        return dict(fn=chain_fn, inputs=(x,), bytes=2 * 4 * n, flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "sincos_scalar":
        g = _gen(dev, 6)
        x = _randn((1,), dev, g)
        return dict(fn=sincos_fn, inputs=(x,), bytes=8, flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "chain64M":
        n = (1 << 16) if tiny else (64 << 20)
        g = _gen(dev, 1)
        x = _randn((n,), dev, g) * 2.0  # kiln_bench: randn * 2
        return dict(fn=chain_fn, inputs=(x,), bytes=2 * 4 * n, flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "bias_gelu":
        r, c = (64, 256) if tiny else (8192, 1024 if cpu else 4096)
        g = _gen(dev, 2)
        x, b = _randn((r, c), dev, g), _randn((c,), dev, g)
        return dict(fn=bias_gelu_fn, inputs=(x, b), bytes=4 * (2 * r * c + c), flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "colsum":  # kiln_bench: sum(x * x, 0), x (8192, 2048)
        r, c = (64, 256) if tiny else (8192, 2048)
        g = _gen(dev, 13)
        x = _randn((r, c), dev, g)
        return dict(fn=colsum_fn, inputs=(x,), bytes=4 * (r * c + c), flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "softmax":
        r, c = (64, 256) if tiny else (4096, 1024) if cpu else (8192, 4096)
        g = _gen(dev, 3)
        x = _randn((r, c), dev, g) * 3.0  # kiln_bench: randn * 3
        return dict(fn=softmax_fn, inputs=(x,), bytes=2 * 4 * r * c, flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name in ("softmax_short", "rowsum_short"):  # a million rows of 9 (kiln: several rows per block)
        r, c = (64, 9) if tiny else (1 << 20, 9)
        g = _gen(dev, 12)
        x = _randn((r, c), dev, g) * 3.0
        if name == "softmax_short":
            return dict(fn=softmax_fn, inputs=(x,), bytes=2 * 4 * r * c, flops=0, math=MATH_F32, tol=TOL_F32_EW)
        return dict(fn=rowsum_fn, inputs=(x,), bytes=4 * (r * c + r), flops=0, math=MATH_F32, tol=TOL_F32_EW)
    if name == "layernorm":
        r, c = (64, 256) if tiny else (8192, 1024 if cpu else 4096)
        g = _gen(dev, 4)
        x, w, b = _randn((r, c), dev, g), _randn((c,), dev, g), _randn((c,), dev, g)
        # kiln_bench counts the weight and bias too: 4 * (2 * numel + 2 * cols)
        return dict(fn=layernorm_fn, inputs=(x, w, b), bytes=4 * (2 * r * c + 2 * c), flops=0, math=MATH_F32,
                    tol=TOL_F32_EW)
    if name == "blackscholes":
        n = (1 << 16) if tiny else (4 << 20 if cpu else 16 << 20)
        g = _gen(dev, 7)
        # kiln_bench: S, K uniform in [50, 100), T uniform in [0.25, 2.25)
        s = torch.rand((n,), generator=g, device=dev) * 50 + 50
        k = torch.rand((n,), generator=g, device=dev) * 50 + 50
        t = torch.rand((n,), generator=g, device=dev) * 2 + 0.25
        return dict(fn=blackscholes_fn, inputs=(s, k, t), bytes=5 * 4 * n, flops=0, math=MATH_F32, tol=(1e-4, 1e-4))
    if name == "numpy_fn":
        n, m = (32, 20) if tiny else (1024, 640)
        g = _gen(dev, 5)
        X, Y = _randn((n, m), dev, g), _randn((n, m), dev, g) * 0.1  # kiln_bench: Y = randn * 0.1
        return dict(fn=numpy_fn, inputs=(X, Y), bytes=4 * (2 * n * m + n), flops=0, math=MATH_F32,
                    tol=(2e-3, 2e-3))
    if name in ("mlp_f32", "mlp_bf16"):
        bf16 = name.endswith("bf16")
        dtype = torch.bfloat16 if bf16 else torch.float32
        es = 2 if bf16 else 4
        B, D, Hd = (4, 64, 256) if tiny else (64, 1024, 4096)
        torch.manual_seed(7)
        model = _module(MLP(D, Hd), dev, dtype)
        g = _gen(dev, 7)
        x = _randn((B, D), dev, g, dtype)
        flops = 2 * B * (D * Hd * 2)
        weights = D * Hd * 2 + Hd + D
        return dict(fn=model, inputs=(x,), bytes=es * (weights + 2 * B * D), flops=flops,
                    math=MATH_BF16 if bf16 else MATH_F32, tol=TOL_BF16 if bf16 else TOL_F32_GEMM)
    if name in ("bert_layer_f32", "bert_layer_bf16"):
        bf16 = name.endswith("bf16")
        dtype = torch.bfloat16 if bf16 else torch.float32
        es = 2 if bf16 else 4
        B, S, H, heads, Fh = (2, 16, 64, 4, 256) if tiny else (8, 128, 768, 12, 3072)
        torch.manual_seed(8)
        model = _module(BertLayer(H, heads, Fh, eps=1e-5), dev, dtype)
        g = _gen(dev, 8)
        x = _randn((B, S, H), dev, g, dtype)
        d = H // heads
        flops = 2 * B * S * (H * 3 * H + H * H + 2 * H * Fh) + 2 * 2 * B * heads * S * S * d
        weights = sum(p.numel() for p in model.parameters())
        return dict(fn=model, inputs=(x,), bytes=es * (weights + 2 * B * S * H), flops=flops,
                    math=MATH_BF16 if bf16 else MATH_F32, tol=TOL_BF16 if bf16 else TOL_F32_GEMM)
    if name == "resnet18":
        B, HW = (1, 32) if tiny else (16, 224)
        torch.manual_seed(9)
        model = _module(ResNet18(), dev, torch.float32)
        g = _gen(dev, 9)
        x = _randn((B, 3, HW, HW), dev, g)
        macs = conv_fc_macs(model, (x,))  # 1,814,073,344 per 224x224 image
        weights = sum(p.numel() for p in model.parameters())
        return dict(fn=model, inputs=(x,), bytes=4 * (weights + x.numel() + B * 1000), flops=2 * macs,
                    math=MATH_TF32_CONV, tol=TOL_TF32, flops_formula="2 * MACs of all conv and fc layers, counted from shapes")
    if name.startswith("linears_m"):  # kiln_bench's few-row products: bert-base's four weights on m rows, bf16
        m = int(name[len("linears_m"):].split("_")[0])
        torch.manual_seed(20)
        model = _module(Linears(), dev, torch.bfloat16)
        g = _gen(dev, 20)
        x = _randn((m, 768), dev, g, torch.bfloat16)
        weights = sum(p.numel() for p in model.parameters())
        return dict(fn=model, inputs=(x,), bytes=2 * weights, flops=2 * m * (768 * 2304 + 768 * 768 + 2 * 768 * 3072),
                    math=MATH_BF16, tol=TOL_BF16)
    if name.startswith("bert_base_"):
        return bert_base_workload(name, dev)
    if name == "minilm_32x64":
        return minilm_workload(dev)
    raise ValueError(f"no workload {name}")


WORKLOADS = ("sincos_scalar", "chain64M", "chain16M", "chain1M", "bias_gelu", "colsum", "softmax", "softmax_short", "rowsum_short", "layernorm", "numpy_fn",
             "blackscholes",
             "mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18",
             "bert_base_b1_f32", "bert_base_b1_bf16", "bert_base_b8x128_f32", "bert_base_b8x128_bf16", "minilm_32x64",
             "linears_m1_bf16", "linears_m8_bf16", "linears_m16_bf16", "linears_m32_bf16", "linears_m64_bf16")
# the workloads kiln_bench runs on the CPU (--device cpu runs these; cuda runs the others and the
# CPU ones that kiln_bench runs on both)
CPU_WORKLOADS = ("sincos_scalar", "chain16M", "chain1M", "bias_gelu", "colsum", "softmax", "layernorm", "numpy_fn", "blackscholes",
                 "mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18", "minilm_32x64")
CPU_ONLY = ("minilm_32x64", "chain16M", "chain1M", "colsum")

# Whole models: kiln_bench writes their weights (bert_base) and inputs, and its compiled output,
# to KILN_BENCH_DATA (default /tmp/kiln-bench-data); the anchor loads the same ones into Hugging
# Face's BertModel and checks its eager output against kiln's before timing (row "kiln_max_err").


def _bench_data():
    return os.environ.get("KILN_BENCH_DATA", "/tmp/kiln-bench-data")


def _load_st(path):
    from safetensors.torch import load_file
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} (run kiln_bench first: it writes the weights, inputs and its output)")
    return load_file(path)


class _LastHidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def bert_base_workload(name, dev):
    from transformers import BertModel
    bf16 = name.endswith("bf16")
    dtype = torch.bfloat16 if bf16 else torch.float32
    shape = "b1" if "_b1_" in name else "b8x128"
    d = os.path.join(_bench_data(), "bert_base")
    inputs = _load_st(os.path.join(d, f"inputs_{shape}.safetensors"))
    kiln_out = _load_st(os.path.join(d, f"kiln_{name}.safetensors"))["last_hidden_state"]
    model = BertModel.from_pretrained(d, attn_implementation="sdpa", add_pooling_layer=False).to(device=dev, dtype=dtype).eval()
    ids, mask = inputs["input_ids"].to(dev), inputs["attention_mask"].to(dev)
    B, S = ids.shape
    E, Fh, L = 768, 3072, 12
    flops = L * (2 * B * S * (4 * E * E + 2 * E * Fh) + 4 * B * S * S * E)
    return dict(fn=_LastHidden(model), inputs=(ids, mask), bytes=0, flops=flops, math=MATH_BF16 if bf16 else MATH_F32,
                tol=TOL_BF16 if bf16 else TOL_F32_GEMM, kiln_out=kiln_out)


class _MiniLM(nn.Module):
    """sentence-transformers' pipeline after the tokenizer: BertModel, mean pooling, normalize."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask, types):
        h = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
        return F.normalize(e, p=2, dim=1)


def minilm_workload(dev):
    from transformers import BertModel
    folder = os.environ.get("KILN_MINILM_DIR", "")
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        raise FileNotFoundError("set KILN_MINILM_DIR to all-MiniLM-L6-v2's folder (bash tests/fetch_minilm.sh DEST: DEST/model)")
    d = os.path.join(_bench_data(), "minilm")
    inputs = _load_st(os.path.join(d, "inputs.safetensors"))
    kiln_out = _load_st(os.path.join(d, "kiln_minilm_32x64.safetensors"))["embeddings"]
    model = BertModel.from_pretrained(folder, attn_implementation="sdpa").to(dev).eval()
    args = tuple(inputs[k].to(dev) for k in ("input_ids", "attention_mask", "token_type_ids"))
    return dict(fn=_MiniLM(model), inputs=args, bytes=0, flops=0, math=MATH_F32, tol=TOL_F32_GEMM, kiln_out=kiln_out)


# ---------------------------------------------------------------------------------------------
# timing

class Timer:
    def __init__(self, device, min_time, min_repeats, max_repeats=5000, throughput_time=0.1):
        self.cuda = device.type == "cuda"
        self.device = device
        self.min_time, self.min_repeats, self.max_repeats = min_time, min_repeats, max_repeats
        self.throughput_time = throughput_time

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def first_call(self, call):
        """Wall time of one call, synchronized (for compile modes: compilation included), in us."""
        self.sync()
        t0 = time.perf_counter()
        out = call()
        self.sync()
        return (time.perf_counter() - t0) * 1e6, out

    def repeats(self, call):
        """Latency: per-call times in us (CUDA events around each call, synchronized after each, on
        the GPU; perf_counter on the CPU), and the host's wall time inside each call in us."""
        times, host = [], []
        start = time.perf_counter()
        if self.cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            while len(times) < self.min_repeats or time.perf_counter() - start < self.min_time:
                e0.record()
                t0 = time.perf_counter()
                call()
                host.append((time.perf_counter() - t0) * 1e6)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3)
                if len(times) >= self.max_repeats:
                    break
        else:
            while len(times) < self.min_repeats or time.perf_counter() - start < self.min_time:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
                if len(times) >= self.max_repeats:
                    break
            host = list(times)
        return times, host

    def throughput(self, call, latency_us, runs=5):
        """Throughput on the GPU: n calls back to back between two CUDA events with one synchronize,
        n chosen from the latency so that a run lasts >= throughput_time; the median of `runs`
        runs, per call, in us (as kiln_bench's GPU rows). None on the CPU."""
        if not self.cuda:
            return None
        n = int(min(200000, max(3, math.ceil(self.throughput_time * 1e6 / max(latency_us, 0.1)))))
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        per_call = []
        for _ in range(runs):
            self.sync()
            e0.record()
            for _ in range(n):
                call()
            e1.record()
            e1.synchronize()
            per_call.append(e0.elapsed_time(e1) * 1e3 / n)
        return statistics.median(per_call)


def snapshot(out):
    """A copy of a workload's output (a tensor, or a tuple of them) that later calls cannot overwrite."""
    if isinstance(out, tuple):
        return tuple(o.detach().clone() for o in out)
    return out.detach().clone()


def compare(out, ref, tol):
    """allclose with rtol and an atol scaled by max(1, max |ref|); returns (ok, max_abs_err, detail)."""
    rtol, atol_rel = tol
    if isinstance(out, tuple) and isinstance(ref, tuple) and len(out) == len(ref):  # several outputs
        results = [compare(o, r, tol) for o, r in zip(out, ref)]
        bad = [r for r in results if not r[0]]
        return (not bad), max(r[1] for r in results), bad[0][2] if bad else ""
    if not isinstance(out, torch.Tensor):
        return False, float("nan"), f"output is {type(out).__name__}, not a Tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return False, float("nan"), f"shape {tuple(out.shape)} != eager {tuple(ref.shape)}"
    o, r = out.detach().float(), ref.detach().float()
    scale = max(1.0, float(r.abs().max().item())) if r.numel() else 1.0
    atol = atol_rel * scale
    err = float((o - r).abs().max().item()) if r.numel() else 0.0
    ok = bool(torch.allclose(o, r, rtol=rtol, atol=atol))
    return ok, err, "" if ok else f"max |diff| {err:.3g} exceeds rtol {rtol:g}, atol {atol:.3g}"


def _finite(v):
    """JSON has no NaN or infinity: they become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


# ---------------------------------------------------------------------------------------------
# the run

class Anchor:
    def __init__(self, args):
        self.args = args
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("torch_anchor: --device cuda but torch.cuda.is_available() is False (use --device cpu)")
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.dev_name = f"cuda:{self.device.index}"
            self.threads = 0
        else:
            self.device = torch.device("cpu")
            self.dev_name = "cpu"
            self.threads = torch.get_num_threads()
        self.timer = Timer(self.device, args.min_time, args.min_repeats, throughput_time=args.throughput_time)
        self.rows = []
        self.copy_gbps = 0.0
        self.meta = self.make_meta()

    # -- bookkeeping ------------------------------------------------------------------------
    def make_meta(self):
        a = self.args
        m = {
            "tool": "bench/anchors/torch_anchor.py",
            "argv": sys.argv,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": self.dev_name,
            "tiny": bool(a.tiny),
            "quick": bool(a.quick),
            "min_time_s": a.min_time,
            "min_repeats": a.min_repeats,
            "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            "inductor_cache_fresh": not _CACHE_DIR_GIVEN,
            "timing": "as kiln_bench's GPU rows, after the first call and >= 3 warm-up calls: latency_us (= median_us) "
                      "CUDA events around each call, synchronized after each; throughput_us calls back to back between "
                      "two events, one synchronize, >= throughput_time_s a run, median of 5 runs, per call; host_us "
                      "the host's wall time inside a call (median over the latency repeats); gbps and tflops by "
                      "throughput" if self.device.type == "cuda" else "perf_counter around each call",
            "throughput_time_s": a.throughput_time,
            "mode": "torch.inference_mode()",
            "compile_ro_static_inputs": not a.ro_copy_inputs,
            "first_call_note": "compile/compile_ro first_call_us: torch.compile + first run, wall clock; torch._dynamo.reset() "
                               "before each, but compile_ro can reuse inductor's on-disk cache that compile filled",
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "layernorm_eps": 1e-5,
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
        }
        try:
            import triton  # noqa: F401

            m["triton"] = triton.__version__
        except Exception:  # noqa: BLE001
            m["triton"] = None
        if self.device.type == "cuda":
            p = torch.cuda.get_device_properties(self.device)
            m.update(gpu=p.name, sm=f"sm_{p.major}{p.minor}", sm_count=p.multi_processor_count,
                     gpu_memory_gib=round(p.total_memory / 2**30, 1),
                     cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
        return m

    def write(self):
        if not self.args.json:
            return
        for r in self.rows:  # pct_copy once the copy bandwidth is known
            if self.copy_gbps > 0 and r.get("gbps") and r.get("bytes"):
                r["pct_copy"] = 100.0 * r["gbps"] / self.copy_gbps
        doc = _finite({"meta": self.meta, "rows": self.rows})
        path = self.args.json
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, allow_nan=False, default=str)
            f.write("\n")
        os.replace(tmp, path)

    def add(self, row):
        self.rows.append(row)
        if row.get("median_us"):
            extra = ""
            if row.get("gbps"):
                extra += f", {row['gbps']:.1f} GB/s"
            if row.get("tflops"):
                extra += f", {row['tflops']:.1f} TFLOP/s"
            thr = f"  thru {row['throughput_us']:10.1f}" if row.get("throughput_us") else ""
            log(f"{row['workload']:<16} {row['method']:<10} median {row['median_us']:10.1f} us  min {row['min_us']:10.1f}{thr}"
                f"  host {row.get('host_us', 0):8.1f}  first {row['first_call_us'] / 1e3:9.1f} ms  x{row['repeats']}{extra}  ok={row['ok']}")
        else:
            log(f"{row['workload']:<16} {row['method']:<10} NOT TIMED: {row.get('error', '?')}")
        self.write()

    def base_row(self, workload, method, w):
        return {"workload": workload, "method": method, "device": self.dev_name, "threads": self.threads,
                "median_us": 0.0, "min_us": 0.0, "first_call_us": 0.0, "repeats": 0,
                "bytes": float(w.get("bytes", 0)), "flops": float(w.get("flops", 0)), "gbps": 0.0, "tflops": 0.0,
                "math": w.get("math", ""), "ok": False}

    def timed_row(self, row, first_us, call):
        """Times `call` (latency, host time, throughput) into row; first_us is its first call."""
        times, host = self.timer.repeats(call)
        row.update(first_call_us=first_us, repeats=len(times), median_us=statistics.median(times), min_us=min(times),
                   latency_us=statistics.median(times), host_us=statistics.median(host))
        thr = self.timer.throughput(call, row["median_us"])
        if thr is not None:
            row["throughput_us"] = thr
        rate_us = thr if thr is not None else row["median_us"]
        if row["bytes"] > 0:
            row["gbps"] = row["bytes"] / (rate_us * 1e3)
        if row["flops"] > 0:
            row["tflops"] = row["flops"] / (rate_us * 1e6)
        return row

    # -- roofline rows ------------------------------------------------------------------------
    def bench_copy(self):
        n = (1 << 20) if self.args.tiny else (256 << 20)  # 1 GiB of f32 on the GPU
        if self.device.type == "cpu" and not self.args.tiny:
            n = 16 << 20
        w = {"bytes": 2 * 4 * n, "math": "-"}
        row = self.base_row("copy", "clone", w)
        try:
            x = torch.rand(n, device=self.device)
            first, _ = self.timer.first_call(lambda: x.clone())
            for _ in range(3):
                x.clone()
            self.timer.sync()
            row["ok"] = True
            self.timed_row(row, first, lambda: x.clone())
            self.copy_gbps = row["gbps"]
            del x
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        self.add(row)

    def bench_gemm(self, dtype, workload, math_mode):
        n = self.args.gemm_n or (256 if self.args.tiny else (8192 if self.device.type == "cuda" else 2048))
        w = {"bytes": 3 * n * n * (2 if dtype == torch.bfloat16 else 4), "flops": 2 * n**3, "math": math_mode}
        row = self.base_row(workload, "matmul", w)
        row["shape"] = [n, n, n]
        try:
            g = _gen(self.device, 11)
            a, b = _randn((n, n), self.device, g, dtype), _randn((n, n), self.device, g, dtype)
            first, _ = self.timer.first_call(lambda: torch.mm(a, b))
            for _ in range(3):
                torch.mm(a, b)
            self.timer.sync()
            row["ok"] = True
            self.timed_row(row, first, lambda: torch.mm(a, b))
            row["tflops_best"] = row["flops"] / (row["min_us"] * 1e6)
            row["bytes"] = 0.0  # a rate row: report the arithmetic, not GB/s
            row["gbps"] = 0.0
            del a, b
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        self.add(row)

    # -- workloads ----------------------------------------------------------------------------
    def bench_workload(self, name):
        try:
            w = make_workload(name, self.device, self.args.tiny)
        except Exception as e:  # noqa: BLE001
            for method in self.args.methods:
                row = self.base_row(name, method, {})
                row["error"] = f"setup: {type(e).__name__}: {e}"
                self.add(row)
            traceback.print_exc()
            return
        fn, inputs, tol = w["fn"], w["inputs"], w["tol"]
        ref = None
        eager_median = eager_thr = 0.0
        # eager first: it is the reference
        for method in METHODS:
            if method not in self.args.methods and method != "eager":
                continue
            row = self.base_row(name, method, w)
            row["tol"] = list(tol)
            if w.get("flops_formula"):
                row["flops_formula"] = w["flops_formula"]
            compiled = None
            try:
                if method == "eager":
                    call = lambda: fn(*inputs)  # noqa: E731
                else:
                    if ref is None:
                        raise RuntimeError("no eager reference (eager failed)")
                    torch._dynamo.reset()
                    if method == "compile_ro" and not self.args.ro_copy_inputs:
                        # The inputs are the same buffers on every call (as in kiln_bench), so tell
                        # CUDA graphs their addresses are fixed; otherwise each replay first copies
                        # every input into the graph's own buffers (parameters are static anyway).
                        for t in inputs:
                            torch._dynamo.mark_static_address(t)
                        row["static_inputs"] = True
                    compiled = torch.compile(fn, mode=MODES[method])
                    call = lambda: compiled(*inputs)  # noqa: E731
                first, out = self.timer.first_call(call)
                for _ in range(3):
                    out = call()
                out = call()
                if method == "eager":
                    ref = snapshot(out)
                    row.update(ok=True, max_err=0.0)
                    if "kiln_out" in w:  # the same model and inputs as kiln_bench: the two sides agree
                        ok, err, detail = compare(ref, w["kiln_out"].float().to(ref.device), tol)
                        row["kiln_max_err"] = err
                        if not ok:
                            row.update(ok=False, error=f"eager output differs from kiln's: {detail}")
                            ref = None
                else:
                    ok, err, detail = compare(snapshot(out), ref, tol)
                    row.update(ok=ok, max_err=err)
                    if not ok:
                        row["error"] = f"output differs from eager: {detail}"
                del out
                self.timer.sync()
                if row["ok"] and method in self.args.methods:
                    self.timed_row(row, first, call)
                    if method == "eager":
                        eager_median, eager_thr = row["median_us"], row.get("throughput_us", 0.0)
                    if eager_median > 0:
                        row["speedup_vs_eager"] = eager_median / row["median_us"]
                    if eager_thr > 0 and row.get("throughput_us"):
                        row["throughput_speedup_vs_eager"] = eager_thr / row["throughput_us"]
                else:
                    row["first_call_us"] = first
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                row["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]
                traceback.print_exc()
            if method in self.args.methods:
                self.add(row)
            del compiled
            call = None
            try:
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass
        del w, fn, inputs, ref
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(self):
        a = self.args
        log(f"torch {torch.__version__} on {self.meta.get('gpu', self.meta['cpu'])} ({self.dev_name}); inductor cache "
            f"{os.environ['TORCHINDUCTOR_CACHE_DIR']}{' (fresh)' if not _CACHE_DIR_GIVEN else ''}; "
            f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32} cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}"
            f"{'; TINY shapes' if a.tiny else ''}")
        with torch.inference_mode():
            if not a.no_rates:
                self.bench_copy()
                self.bench_gemm(torch.bfloat16, "gemm_bf16", MATH_BF16)
                self.bench_gemm(torch.float32, "gemm_f32", MATH_F32)
            for name in WORKLOADS:
                if a.filter and not any(f and f in name for f in a.filter.split(",")):
                    continue
                on_device = name in CPU_WORKLOADS if self.device.type == "cpu" else name not in CPU_ONLY
                if not on_device and not a.filter:
                    continue
                self.bench_workload(name)
        self.write()
        bad = [r for r in self.rows if not r.get("ok")]
        log(f"{len(self.rows)} rows, {len(bad)} not ok" + (f"; wrote {a.json}" if a.json else ""))
        return 1 if bad else 0


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--filter", default="", help="only workloads whose name contains SUBSTR, or one of a comma list (copy/GEMM rates always run)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer repeats (0.1 s, >= 5 per row)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke test, not comparable to kiln")
    p.add_argument("--min-time", type=float, default=None, help="seconds of timed repeats per row (default 0.5)")
    p.add_argument("--min-repeats", type=int, default=None, help="at least this many timed calls (default 20)")
    p.add_argument("--throughput-time", type=float, default=None,
                   help="seconds of back-to-back calls per throughput run (5 runs; default 0.1, 0.02 with --quick)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of eager,compile,compile_ro")
    p.add_argument("--gemm-n", type=int, default=0, help="size of the GEMM rate rows (default 8192 on cuda)")
    p.add_argument("--no-rates", action="store_true", help="skip the copy and GEMM rate rows")
    p.add_argument("--ro-copy-inputs", action="store_true",
                   help="compile_ro without marking the inputs static (CUDA graphs then copy them in on each call)")
    a = p.parse_args(argv)
    if a.min_time is None:
        a.min_time = 0.1 if a.quick else 0.5
    if a.min_repeats is None:
        a.min_repeats = 5 if a.quick else 20
    if a.throughput_time is None:
        a.throughput_time = 0.02 if a.quick else 0.1
    a.methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    unknown = set(a.methods) - set(METHODS)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}")
    return a


def main(argv=None):
    args = parse(argv)
    return Anchor(args).run()


if __name__ == "__main__":
    sys.exit(main())
