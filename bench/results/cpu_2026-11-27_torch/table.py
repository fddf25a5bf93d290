# kiln (eager, fused, compiled with generated C++) against torch (eager, torch.compile) on the CPU,
# from the files run.sh wrote in this folder: medians, and kiln compiled / torch.compile.
import glob, json, os
here = os.path.dirname(os.path.abspath(__file__))
k, t = {}, {}
for f in glob.glob(os.path.join(here, "kiln_*.json")):
    for r in json.load(open(f)):
        if r["device"] == "cpu": k[(r["workload"], r["threads"], r["method"])] = r["median_us"]
for f in glob.glob(os.path.join(here, "torch_*_t*.json")):
    d = json.load(open(f))
    rows = d["rows"] if isinstance(d, dict) else d
    for r in rows:
        if "median_us" in r: t[(r["workload"], r["threads"], r["method"])] = r["median_us"]
print("| workload | threads | kiln eager | kiln fused | kiln compiled | torch eager | torch.compile | torch.compile / kiln compiled |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
ms = lambda v: f"{v / 1000:.2f} ms" if v else "-"
for w in ("chain16M", "chain1M", "bias_gelu", "softmax", "layernorm", "numpy_fn", "blackscholes"):
    for th in (1, 2):
        kc, tc = k.get((w, th, "compiled")), t.get((w, th, "compile"))
        print(f"| {w} | {th} | {ms(k.get((w, th, 'eager')))} | {ms(k.get((w, th, 'fused')))} | {ms(kc)} | "
              f"{ms(t.get((w, th, 'eager')))} | {ms(tc)} | {f'{tc / kc:.2f}x' if kc and tc else '-'} |")
