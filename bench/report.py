#!/usr/bin/env python3
"""Side-by-side report of kiln_bench and the PyTorch anchor (bench/anchors/torch_anchor.py).

    python3 bench/report.py --kiln KILN.json --torch TORCH.json --out DIR [--command "..."]

Writes DIR/report.md and DIR/report.svg and prints the markdown. Only GPU rows (device "cuda...")
are compared. Each side times every row two ways: latency (CUDA events around each synchronized
call: median_us / latency_us) and throughput (calls back to back, one synchronize: throughput_us).
The headline measure of a workload is throughput, except for launch-bound ones (sincos_scalar and
the batch-1 models, LATENCY_HEADLINE), where it is latency; the table says which. For each
workload, "best" is the lowest headline time over that side's methods (kiln's warmstart rows and
rows with "ok": false are left out); the other measure and the host time per call are shown beside
it. Files from before throughput was measured (no throughput_us) are compared by latency.

Roofline: the least time the workload can take on this GPU,
    max(bytes / copy bandwidth, flops / GEMM rate of its dtype)
with the copy bandwidth of kiln's memcpy row (the torch anchor's clone row if kiln has none) and
the GEMM rates of the anchor's gemm_bf16 / gemm_f32 rows (f32 without TF32; resnet18 is held to
the f32 rate although torch runs its convolutions in TF32). Bandwidth-bound workloads have no
flops and GEMM-heavy ones are normally flop-bound, so this is the copy-bandwidth roofline for the
former and the GEMM roofline for the latter; the table says which bound applies.

Standard library only; reads kiln_bench's JSON as written (bare nan / inf included).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import sys

ORDER = ("sincos_scalar", "chain64M", "bias_gelu", "softmax", "softmax_short", "rowsum_short", "layernorm", "numpy_fn", "blackscholes",
         "mlp_f32", "mlp_bf16", "bert_layer_f32", "bert_layer_bf16", "resnet18")
RATE_ROWS = ("copy", "gemm_bf16", "gemm_f32")
NOT_FOR_BEST = {"warmstart", "host", "memcpy", "autotune_cold", "autotune_warm"}
# launch-bound workloads: their headline is latency (one call's time with the GPU idle before it)
LATENCY_HEADLINE = ("sincos_scalar", "bert_base_b1_f32", "bert_base_b1_bf16")
GEMM_HEAVY = ("mlp", "bert_layer", "resnet18")


def _bert_params(h=768, ffn=3072):
    return (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h


def _resnet18_params():
    p = 3 * 64 * 49 + 2 * 64
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for blk in range(2):
            ci = cin if blk == 0 else cout
            p += ci * cout * 9 + 2 * cout + cout * cout * 9 + 2 * cout
            if blk == 0 and (stride != 1 or ci != cout):
                p += ci * cout + 2 * cout
        cin = cout
    return p + 512 * 1000 + 1000


_MLP_W = 1024 * 4096 * 2 + 4096 + 1024
_BERT_FLOPS = 2 * 8 * 128 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072) + 2 * 2 * 8 * 12 * 128 * 128 * 64
_RESNET18_MACS = 1_814_073_344  # per 224x224 image: conv and fc layers, counted from the shapes
# Used only where neither JSON gives the row's bytes / flops (same definitions as the anchor's).
DEFAULTS = {
    "sincos_scalar": {"bytes": 8},
    "chain64M": {"bytes": 2 * 4 * (64 << 20)},
    "bias_gelu": {"bytes": 4 * (2 * 8192 * 4096 + 4096)},
    "softmax": {"bytes": 2 * 4 * 8192 * 4096},
    "softmax_short": {"bytes": 2 * 4 * (1 << 20) * 9},
    "rowsum_short": {"bytes": 4 * ((1 << 20) * 9 + (1 << 20))},
    "layernorm": {"bytes": 4 * (2 * 8192 * 4096 + 2 * 4096)},
    "numpy_fn": {"bytes": 4 * (2 * 1024 * 640 + 1024)},
    "blackscholes": {"bytes": 5 * 4 * (16 << 20)},
    "mlp_f32": {"flops": 2 * 64 * (1024 * 4096 * 2), "bytes": 4 * (_MLP_W + 2 * 64 * 1024)},
    "mlp_bf16": {"flops": 2 * 64 * (1024 * 4096 * 2), "bytes": 2 * (_MLP_W + 2 * 64 * 1024)},
    "bert_layer_f32": {"flops": _BERT_FLOPS, "bytes": 4 * (_bert_params() + 2 * 8 * 128 * 768)},
    "bert_layer_bf16": {"flops": _BERT_FLOPS, "bytes": 2 * (_bert_params() + 2 * 8 * 128 * 768)},
    "resnet18": {"flops": 2 * 16 * _RESNET18_MACS, "bytes": 4 * (_resnet18_params() + 16 * 3 * 224 * 224 + 16 * 1000)},
}


# ---------------------------------------------------------------------------------------------
# reading

def load(path):
    """Returns (rows, meta). kiln_bench writes bare nan / -nan / inf, which JSON lacks."""
    if not path or not os.path.exists(path):
        print(f"report.py: {path or '(no file)'} not found; that side is empty", file=sys.stderr)
        return [], {}
    with open(path) as f:
        text = f.read()

    def fix(m):
        word = m.group(3).lower()
        if word == "nan":
            return m.group(1) + "NaN"
        return m.group(1) + ("-Infinity" if m.group(2) else "Infinity")

    text = re.sub(r"(:\s*)(-?)(nan|inf(?:inity)?)\b", fix, text, flags=re.IGNORECASE)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"report.py: cannot parse {path}: {e}; that side is empty", file=sys.stderr)
        return [], {}
    if isinstance(doc, dict):
        rows, meta = doc.get("rows", []), doc.get("meta", {}) or {}
    elif isinstance(doc, list):
        rows, meta = doc, {}
    else:
        rows, meta = [], {}
    return [r for r in rows if isinstance(r, dict)], meta


def num(row, key):
    """row[key] as a finite float, else None."""
    if not row:
        return None
    v = row.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def is_gpu(row):
    return str(row.get("device", "")).startswith("cuda")


def timed(row):
    m = num(row, "median_us")
    return m is not None and m > 0 and row.get("ok", True) is not False


def latency_us(row):
    return num(row, "latency_us") or num(row, "median_us")


def throughput_us(row):
    return num(row, "throughput_us")


def measure_of(workload, rows):
    """The headline measure of a workload: "latency" for launch-bound ones and where a side's rows
    have no throughput (files from before it was measured), else "throughput"."""
    if workload in LATENCY_HEADLINE:
        return "latency"
    mine = [r for r in rows if r.get("workload") == workload and timed(r) and r.get("method") not in NOT_FOR_BEST]
    return "throughput" if mine and all(throughput_us(r) for r in mine) else "latency"


def time_of(row, measure):
    return throughput_us(row) if measure == "throughput" else latency_us(row)


def best_row(rows, workload, measure="latency"):
    cands = [r for r in rows if r.get("workload") == workload and r.get("method") not in NOT_FOR_BEST and timed(r)
             and time_of(r, measure)]
    return min(cands, key=lambda r: time_of(r, measure)) if cands else None


def copy_gbps(rows):
    best = None
    for r in rows:
        if r.get("workload") == "copy" and timed(r):
            b, m = num(r, "bytes"), throughput_us(r) or num(r, "median_us")
            g = b / (m * 1e3) if b else num(r, "gbps")
            if g and (best is None or g > best[0]):
                best = (g, r)
    return best


def gemm_tflops(rows, workload):
    best = None
    for r in rows:
        if r.get("workload") == workload and timed(r):
            f, m = num(r, "flops"), throughput_us(r) or num(r, "median_us")
            t = f / (m * 1e6) if f else num(r, "tflops")
            if t and (best is None or t > best[0]):
                best = (t, r)
    return best


def first_positive(rows_lists, workload, key):
    for rows in rows_lists:
        for r in rows:
            if r.get("workload") == workload:
                v = num(r, key)
                if v and v > 0:
                    return v
    return None


def default_math(workload):
    if "bf16" in workload:
        return "bf16"
    if workload.startswith("resnet18"):
        return "f32 convs TF32 (torch default)"
    return "f32 (no TF32)"


# ---------------------------------------------------------------------------------------------
# formatting

def fmt_us(v):
    if v is None:
        return "—"
    if v < 0.01:
        return f"{v:.2g}"
    if v < 10:
        return f"{v:.2f}"
    if v < 10000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def fmt_pct(p):
    if p is None:
        return "—"
    if p < 0.1:
        return "<0.1%"
    if p < 10:
        return f"{p:.1f}%"
    return f"{p:.0f}%"


def fmt_ratio(r):
    return "—" if r is None else f"{r:.2f}x"


def md_escape(s):
    return str(s).replace("|", "\\|")


# ---------------------------------------------------------------------------------------------
# the comparison

class Comparison:
    def __init__(self, kiln_rows, torch_rows, kiln_meta, torch_meta):
        self.kiln = [r for r in kiln_rows if is_gpu(r)]
        self.torch = [r for r in torch_rows if is_gpu(r)]
        self.kiln_meta, self.torch_meta = kiln_meta, torch_meta
        self.dropped = (len(kiln_rows) - len(self.kiln), len(torch_rows) - len(self.torch))

        kc, tc = copy_gbps(self.kiln), copy_gbps(self.torch)
        self.copy_kiln = kc[0] if kc else None
        self.copy_torch = tc[0] if tc else None
        if kc:
            self.copy, self.copy_src = kc[0], "kiln memcpy row (device-to-device memcpy)"
        elif tc:
            self.copy, self.copy_src = tc[0], "torch anchor's copy row (tensor clone); kiln's JSON has no GPU copy row"
        else:
            self.copy, self.copy_src = None, "no copy row in either JSON"
        self.gemm = {}
        for dt in ("bf16", "f32"):
            t = gemm_tflops(self.torch, f"gemm_{dt}") or gemm_tflops(self.kiln, f"gemm_{dt}")
            self.gemm[dt] = t

        seen = []
        for r in self.kiln + self.torch:
            w = r.get("workload")
            if isinstance(w, str) and w not in RATE_ROWS and w not in seen:
                seen.append(w)
        self.workloads = [w for w in ORDER if w in seen] + [w for w in seen if w not in ORDER]
        self.lines = [self.line(w) for w in self.workloads]

    def rate_for(self, workload, math_mode):
        dt = "bf16" if ("bf16" in workload or str(math_mode).startswith("bf16")) else "f32"
        g = self.gemm.get(dt)
        return (g[0], dt) if g else (None, dt)

    def line(self, w):
        # like with like: throughput only where every side that has the workload measured it
        sides = [rows for rows in (self.kiln, self.torch) if any(r.get("workload") == w for r in rows)]
        measure = "throughput" if sides and all(measure_of(w, rows) == "throughput" for rows in sides) else "latency"
        kb, tb = best_row(self.kiln, w, measure), best_row(self.torch, w, measure)
        other = "latency" if measure == "throughput" else "throughput"
        kob, tob = best_row(self.kiln, w, other), best_row(self.torch, w, other)
        tmath = next((r.get("math") for r in self.torch if r.get("workload") == w and r.get("math")), None)
        kmath = next((r.get("math") for r in self.kiln if r.get("workload") == w and r.get("math")), None)
        if tmath and kmath and tmath != kmath:
            math_mode = merge_math(kmath, tmath)
        else:
            math_mode = tmath or kmath or default_math(w)
        d = DEFAULTS.get(w, {})
        bytes_ = first_positive([self.kiln, self.torch], w, "bytes") or d.get("bytes")
        flops = first_positive([self.kiln, self.torch], w, "flops") or d.get("flops")
        t_bw = bytes_ / (self.copy * 1e3) if (bytes_ and self.copy) else None
        rate, dt = self.rate_for(w, math_mode)
        t_fl = flops / (rate * 1e6) if (flops and rate) else None
        roof, bound = None, None
        if t_bw is not None and (t_fl is None or t_bw >= t_fl):
            roof, bound = t_bw, "copy"
        elif t_fl is not None:
            roof, bound = t_fl, f"GEMM {dt}"
        if roof is not None and flops and t_fl is None:
            bound += f" (no GEMM {dt} rate measured)"
        kus, tus = (time_of(kb, measure) if kb else None), (time_of(tb, measure) if tb else None)
        kous, tous = (time_of(kob, other) if kob else None), (time_of(tob, other) if tob else None)
        return {
            "workload": w, "math": math_mode, "measure": measure, "kiln": kb, "torch": tb, "kiln_us": kus, "torch_us": tus,
            "ratio": kus / tus if (kus and tus) else None,
            "other": other, "kiln_other": kob, "torch_other": tob, "kiln_other_us": kous, "torch_other_us": tous,
            "other_ratio": kous / tous if (kous and tous) else None,
            "roof_us": roof, "bound": bound, "bytes": bytes_, "flops": flops,
            "kiln_pct": 100 * roof / kus if (roof and kus) else None,
            "torch_pct": 100 * roof / tus if (roof and tus) else None,
        }

    # -- markdown ---------------------------------------------------------------------------
    def markdown(self, kiln_path, torch_path, command):
        tm = self.torch_meta
        gpu = tm.get("gpu") or "unknown GPU (the torch JSON names none)"
        gpu_bits = ", ".join(str(x) for x in (tm.get("sm"), f"{tm['sm_count']} SMs" if tm.get("sm_count") else None) if x)
        date = tm.get("date") or _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        sw = [f"torch {tm.get('torch', '?')}"]
        if tm.get("cuda"):
            sw.append(f"CUDA {tm['cuda']}")
        if tm.get("triton"):
            sw.append(f"triton {tm['triton']}")
        if tm.get("cudnn"):
            sw.append(f"cuDNN {tm['cudnn']}")
        out = []
        out.append("# kiln vs PyTorch on the GPU")
        out.append("")
        out.append(f"- machine: **{gpu}**" + (f" ({gpu_bits})" if gpu_bits else "") + (f", host {tm['host']}" if tm.get("host") else ""))
        out.append(f"- date: {date}")
        out.append(f"- software: {', '.join(sw)}" + (f", python {tm['python']}" if tm.get("python") else ""))
        out.append(f"- command: `{command}`")
        out.append(f"- inputs: kiln `{kiln_path}`, torch `{torch_path}`")
        if tm:
            out.append(f"- torch math defaults: matmul.allow_tf32={tm.get('matmul_allow_tf32')}, "
                       f"cudnn.allow_tf32={tm.get('cudnn_allow_tf32')}, float32_matmul_precision={tm.get('float32_matmul_precision')}; "
                       f"torch.compile into a {'fresh' if tm.get('inductor_cache_fresh') else 'given'} inductor cache")
        if tm.get("tiny"):
            out.append("- **WARNING: the torch anchor ran with --tiny shapes: its times are not comparable to kiln's**")
        if tm.get("quick"):
            out.append("- note: the torch anchor ran with --quick (fewer repeats)")
        out.append("")
        ro = ", inputs marked static" if tm.get("compile_ro_static_inputs") else ""
        out.append("Times are medians per call in microseconds, measured the same way on both sides: **throughput** "
                   "(calls back to back, one synchronize at the end; median of 5 runs of >= 100 ms) and **latency** "
                   "(CUDA events around each call, synchronized after each: the host's work before a launch counts "
                   "where the GPU waits for it). The headline is throughput, except for launch-bound rows "
                   f"({', '.join(LATENCY_HEADLINE)}), whose headline is latency; the measure column says which. "
                   "kiln / torch below 1 means kiln is faster. torch methods: eager, compile (torch.compile default mode), "
                   f"compile_ro (torch.compile mode=\"reduce-overhead\", CUDA graphs{ro}).")
        out.append("")
        head = ["workload", "math", "headline measure", "kiln best (method, us)", "torch best (method, us)", "kiln / torch",
                "other measure: kiln best / torch best (us)", "kiln / torch (other)",
                "kiln % of roofline", "torch % of roofline", "roofline (us, bound)"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---", "---", "---"] + ["---:"] * (len(head) - 3)) + "|")
        for ln in self.lines:
            kb, tb = ln["kiln"], ln["torch"]
            kcell = f"{kb['method']} {fmt_us(ln['kiln_us'])}" if kb else "—"
            tcell = f"{tb['method']} {fmt_us(ln['torch_us'])}" if tb else "—"
            ko, to = ln["kiln_other"], ln["torch_other"]
            ocell = (f"{ln['other']}: " + (f"{ko['method']} {fmt_us(ln['kiln_other_us'])}" if ko else "—") + " / "
                     + (f"{to['method']} {fmt_us(ln['torch_other_us'])}" if to else "—"))
            roof = f"{fmt_us(ln['roof_us'])} ({ln['bound']})" if ln["roof_us"] is not None else "—"
            out.append("| " + " | ".join(md_escape(c) for c in (
                ln["workload"], ln["math"], ln["measure"], kcell, tcell, fmt_ratio(ln["ratio"]), ocell,
                fmt_ratio(ln["other_ratio"]), fmt_pct(ln["kiln_pct"]), fmt_pct(ln["torch_pct"]), roof)) + " |")
        out.append("")
        out.extend(self.methods_table())
        out.extend(self.first_call_table())
        out.extend(self.footnotes())
        return "\n".join(out) + "\n"

    def methods_table(self):
        kmeth, tmeth = [], []
        for r in self.kiln:
            m = r.get("method")
            if r.get("workload") in self.workloads and m not in NOT_FOR_BEST and m not in kmeth:
                kmeth.append(m)
        for r in self.torch:
            m = r.get("method")
            if r.get("workload") in self.workloads and m not in tmeth:
                tmeth.append(m)
        if not kmeth and not tmeth:
            return []

        def cell(rows, w, m, key):
            for r in rows:
                if r.get("workload") == w and r.get("method") == m:
                    if timed(r):
                        v = {"throughput": throughput_us, "latency": latency_us}.get(key, lambda x: num(x, key))(r)
                        return fmt_us(v) if v else "—"
                    return "not ok" if r.get("ok") is False else "—"
            return "—"

        head = ["workload"] + [f"kiln {m}" for m in kmeth] + [f"torch {m}" for m in tmeth]
        out = []
        for key, title, note in (
                ("throughput", "Every method: throughput (us per call, back to back)", ""),
                ("latency", "Every method: latency (us per call, synchronized)", ""),
                ("host_us", "Every method: host time per call (us)",
                 "The host's wall time inside one call (median over the latency repeats): for torch, Python, "
                 "dynamo's guards and the launches; for kiln, the guards, the launches and the executor. Where it "
                 "exceeds the GPU time, back-to-back calls are bound by it.")):
            out += [f"## {title}", ""]
            if note:
                out += [note, ""]
            out.append("| " + " | ".join(head) + " |")
            out.append("|---|" + "|".join("---:" for _ in head[1:]) + "|")
            for w in self.workloads:
                cells = [w] + [cell(self.kiln, w, m, key) for m in kmeth] + [cell(self.torch, w, m, key) for m in tmeth]
                out.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
            out.append("")
        return out

    def first_call_table(self):
        def first(rows, w, m):
            for r in rows:
                if r.get("workload") == w and r.get("method") == m:
                    v = num(r, "first_call_us")
                    if not v or v <= 0:
                        return "—"
                    return f"{v / 1e3:.2f}" if v < 1e4 else f"{v / 1e3:.1f}" if v < 1e6 else f"{v / 1e3:.0f}"
            return "—"

        cols = [("kiln compiled", self.kiln, "compiled"), ("kiln warmstart", self.kiln, "warmstart"),
                ("kiln max_autotune (tuning only)", self.kiln, "max_autotune"),
                ("kiln max_autotune cold", self.kiln, "autotune_cold"), ("kiln max_autotune warm", self.kiln, "autotune_warm"),
                ("torch compile", self.torch, "compile"), ("torch compile_ro", self.torch, "compile_ro")]
        if not any(first(rows, w, m) != "—" for _, rows, m in cols for w in self.workloads):
            return []
        out = ["## First call (ms): compile included", "",
               "kiln compiled: cold compile (fresh kernel cache); kiln warmstart: a new process, warm disk cache; "
               "kiln max_autotune (tuning only): its first call in the bench process, kernels already compiled; "
               "max_autotune cold / warm: its first call in a new process with an empty kernel cache / on that cache after; "
               "torch: torch.compile + first run into a fresh inductor cache (compile_ro may reuse what compile cached).", ""]
        out.append("| workload | " + " | ".join(c[0] for c in cols) + " |")
        out.append("|---|" + "|".join("---:" for _ in cols) + "|")
        for w in self.workloads:
            out.append(f"| {w} | " + " | ".join(first(rows, w, m) for _, rows, m in cols) + " |")
        out.append("")
        return out

    def footnotes(self):
        out = ["## Roofline and notes", ""]
        if self.copy:
            extra = []
            if self.copy_kiln:
                extra.append(f"kiln memcpy {self.copy_kiln:.0f} GB/s")
            if self.copy_torch:
                extra.append(f"torch clone {self.copy_torch:.0f} GB/s")
            out.append(f"- copy bandwidth used: **{self.copy:.0f} GB/s** (read + write counted), from the {self.copy_src}"
                       + (f"; measured: {', '.join(extra)}" if extra else ""))
        else:
            out.append("- copy bandwidth: not measured (no copy row): no bandwidth roofline")
        for dt, label in (("bf16", "bf16"), ("f32", "f32, no TF32")):
            g = self.gemm.get(dt)
            if g:
                src = "torch anchor" if g[1] in self.torch else "kiln_bench"
                shape = g[1].get("shape")
                shape = "x".join(str(s) for s in shape) if isinstance(shape, list) else "8192^3"
                line = f"- GEMM rate {label}: **{g[0]:.1f} TFLOP/s** ({src} {g[1].get('method', '')} {shape}, median)"
                k = gemm_tflops(self.kiln, f"gemm_{dt}")
                if k and src != "kiln_bench":
                    line += f"; kiln_bench's own gemm_{dt} row: {k[0]:.1f} TFLOP/s ({k[1].get('method', '')})"
                out.append(line)
            else:
                out.append(f"- GEMM rate {label}: not measured")
        out.append("- roofline time = max(bytes / copy bandwidth, flops / GEMM rate of the dtype); "
                   "bytes = least traffic (inputs read once, outputs written once; weights for the models), "
                   "flops = 2 x MACs of the matrix products and convolutions. resnet18 is held to the f32 (no TF32) "
                   "rate although torch's cuDNN convolutions use TF32 (torch's default), so its % can pass 100.")
        out.append("- sincos_scalar moves 8 bytes: its time is launch and synchronization cost, and its % of roofline says nothing.")
        out.append("- best leaves out kiln's warmstart rows (a first-call time) and any row marked not ok; "
                   "% of roofline is by the headline measure.")
        bad = [r for r in self.kiln + self.torch if r.get("ok") is False or r.get("error")]
        for r in bad:
            side = "torch" if r in self.torch else "kiln"
            out.append(f"- **{side} {r.get('workload')} {r.get('method')} not timed / not ok**: {r.get('error', 'ok=false')}")
        if self.dropped[0] or self.dropped[1]:
            out.append(f"- CPU rows left out: {self.dropped[0]} from kiln, {self.dropped[1]} from torch")
        out.append("")
        return out

    # -- svg --------------------------------------------------------------------------------
    def svg(self):
        lines = [ln for ln in self.lines if ln["kiln_us"] or ln["torch_us"]]
        # the axis spans the bars; a roofline far below them (sincos_scalar's 8 bytes) is left off
        vals = [v for ln in lines for v in (ln["kiln_us"], ln["torch_us"]) if v and v > 0]
        W = 1000
        label_w, plot_w, val_w = 170, 500, 230
        x0 = label_w
        bar_h, gap, group_gap = 13, 3, 14
        group_h = 2 * bar_h + gap + group_gap
        top = 74
        H = top + max(1, len(lines)) * group_h + 46
        gpu = self.torch_meta.get("gpu", "")
        s = []
        s.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
                 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">')
        s.append(f'<rect width="{W}" height="{H}" fill="white"/>')
        s.append(f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="16" font-weight="bold">'
                 f'kiln vs PyTorch: best time per call (throughput; latency for launch-bound rows)'
                 f'{(" on " + esc(gpu)) if gpu else ""}</text>')
        # legend
        lx = x0
        for color, name in (("#1f77b4", "kiln best"), ("#ff7f0e", "torch best")):
            s.append(f'<rect x="{lx}" y="34" width="14" height="10" fill="{color}"/>')
            s.append(f'<text x="{lx + 18}" y="43">{name}</text>')
            lx += 100
        s.append(f'<line x1="{lx + 6}" y1="32" x2="{lx + 6}" y2="46" stroke="#222" stroke-width="2" stroke-dasharray="3,2"/>')
        s.append(f'<text x="{lx + 12}" y="43">roofline (least time)</text>')
        s.append(f'<text x="{W - 10}" y="43" text-anchor="end" fill="#555">log scale, microseconds; '
                 f'right: kiln / torch (&lt; 1: kiln faster)</text>')
        if not vals:
            s.append(f'<text x="{W / 2}" y="{top + 20}" text-anchor="middle">no GPU rows to compare</text></svg>')
            return "\n".join(s) + "\n"
        lo = 10 ** math.floor(math.log10(min(vals)))
        hi = 10 ** math.ceil(math.log10(max(vals)))
        if hi <= lo:
            hi = lo * 10
        span = math.log10(hi) - math.log10(lo)

        def X(v):
            return x0 + plot_w * (math.log10(v) - math.log10(lo)) / span

        y_axis_top, y_axis_bot = top - 8, top + len(lines) * group_h - group_gap + 6
        # decade grid
        d = lo
        while d <= hi * 1.0001:
            x = X(d)
            s.append(f'<line x1="{x:.1f}" y1="{y_axis_top}" x2="{x:.1f}" y2="{y_axis_bot}" stroke="#ddd"/>')
            s.append(f'<text x="{x:.1f}" y="{y_axis_bot + 16}" text-anchor="middle" fill="#444">{decade_label(d)}</text>')
            d *= 10
        s.append(f'<line x1="{x0}" y1="{y_axis_top}" x2="{x0}" y2="{y_axis_bot}" stroke="#888"/>')
        for i, ln in enumerate(lines):
            y = top + i * group_h
            s.append(f'<text x="{x0 - 8}" y="{y + bar_h + 2}" text-anchor="end" font-weight="bold">{esc(ln["workload"])}</text>')
            s.append(f'<text x="{x0 - 8}" y="{y + bar_h + 15}" text-anchor="end" font-size="10" fill="#666">'
                     f'{esc(short_math(ln["math"]))}</text>')
            for j, (key, row, color) in enumerate((("kiln_us", ln["kiln"], "#1f77b4"), ("torch_us", ln["torch"], "#ff7f0e"))):
                yy = y + j * (bar_h + gap)
                v = ln[key]
                side = "kiln" if j == 0 else "torch"
                if v:
                    w = max(1.0, X(v) - x0)
                    s.append(f'<rect x="{x0}" y="{yy}" width="{w:.1f}" height="{bar_h}" fill="{color}">'
                             f'<title>{side} {esc(row.get("method", ""))}: {fmt_us(v)} us</title></rect>')
                    txt = f'{side} {fmt_us(v)} us ({row.get("method", "")})'
                else:
                    txt = f"{side} —"
                s.append(f'<text x="{x0 + plot_w + 10}" y="{yy + bar_h - 2}" fill="{color}">{esc(txt)}</text>')
            if ln["roof_us"] and lo <= ln["roof_us"] <= hi:
                xr = X(ln["roof_us"])
                s.append(f'<line x1="{xr:.1f}" y1="{y - 2}" x2="{xr:.1f}" y2="{y + 2 * bar_h + gap + 2}" stroke="#222" '
                         f'stroke-width="2" stroke-dasharray="3,2"><title>roofline {fmt_us(ln["roof_us"])} us '
                         f'({esc(ln["bound"])})</title></line>')
            if ln["ratio"]:
                color = "#2a7d2a" if ln["ratio"] < 1 else "#b22222"
                s.append(f'<text x="{W - 10}" y="{y + bar_h + 6}" text-anchor="end" font-weight="bold" fill="{color}">'
                         f'{fmt_ratio(ln["ratio"])}</text>')
        s.append(f'<text x="{x0 + plot_w / 2}" y="{H - 8}" text-anchor="middle" fill="#444">time per call (us, log scale)</text>')
        s.append("</svg>")
        return "\n".join(s) + "\n"


def merge_math(kmath, tmath):
    """One label for two sides' math modes: "bf16" and "bf16 (f32 accumulate)" read
    "bf16 (kiln: f32 accumulate)"; modes that differ otherwise are both named."""
    for a, b, who in ((kmath, tmath, "kiln"), (tmath, kmath, "torch")):
        rest = a[len(b):].strip() if a.startswith(b) else None
        if rest and rest.startswith("(") and rest.endswith(")"):
            return f"{b} ({who}: {rest[1:-1]})"
    return f"kiln: {kmath}; torch: {tmath}"


def esc(t):
    return str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def short_math(m):
    m = str(m)
    if m.startswith("f32 convs TF32"):
        return "f32 (TF32 convs)"
    return m if len(m) <= 30 else m[:29] + "…"


def decade_label(d):
    if d >= 1e6:
        return f"{d / 1e6:g} s"
    if d >= 1e3:
        return f"{d / 1e3:g} ms"
    if d >= 1:
        return f"{d:g} us"
    return f"{d * 1e3:g} ns"


def main(argv=None):
    p = argparse.ArgumentParser(description="side-by-side report of kiln_bench and the torch anchor")
    p.add_argument("--kiln", required=True, help="kiln_bench --json output")
    p.add_argument("--torch", required=True, help="bench/anchors/torch_anchor.py --json output")
    p.add_argument("--out", required=True, help="directory for report.md and report.svg")
    p.add_argument("--command", default=None, help="the command to name in the header (default: this one)")
    a = p.parse_args(argv)
    krows, kmeta = load(a.kiln)
    trows, tmeta = load(a.torch)
    cmp_ = Comparison(krows, trows, kmeta, tmeta)
    command = a.command or " ".join(shlex.quote(x) for x in ["python3"] + sys.argv)
    md = cmp_.markdown(a.kiln, a.torch, command)
    os.makedirs(a.out, exist_ok=True)
    md_path, svg_path = os.path.join(a.out, "report.md"), os.path.join(a.out, "report.svg")
    with open(md_path, "w") as f:
        f.write(md + f"\n![kiln vs torch](report.svg)\n")
    with open(svg_path, "w") as f:
        f.write(cmp_.svg())
    sys.stdout.write(md)
    print(f"\nwrote {md_path} and {svg_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
