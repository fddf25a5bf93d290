import csv, sys, re, collections
def load(p):
    out = []
    for r in csv.DictReader(l for l in open(p) if l.startswith('"')):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        v = float(r["Metric Value"].replace(",", "")); u = r["Metric Unit"]
        us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
        out.append((r["Kernel Name"], us))
    return out
def cls(n):
    if re.search(r"xmma|cutlass|cask|convertTensor|nhwcAddPadding|cudnn", n): return "cudnn"
    if "gemm" in n.lower() or "sgemm" in n: return "gemm"
    if n.startswith("kiln_red") or n.startswith("triton_red") or n.startswith("triton_per"): return "reduction"
    if n.startswith("kiln_comb"): return "comb"
    if n.startswith("kiln_ew") or n.startswith("triton_poi"): return "elementwise"
    return "other:" + n[:40]
for p in sys.argv[1:]:
    k = load(p); t = collections.defaultdict(float); c = collections.Counter()
    for n, us in k: t[cls(n)] += us; c[cls(n)] += 1
    print(p, f"total {sum(t.values()):.0f} us, {len(k)} kernels")
    for n, v in sorted(t.items(), key=lambda kv: -kv[1]): print(f"   {v:8.1f} us {c[n]:4d}x {n}")
