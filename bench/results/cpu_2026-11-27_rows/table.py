# kiln (eager, fused, compiled with generated C++), the hand-written anchors (bench/hand_cpu.hpp)
# and torch (eager, torch.compile) on the CPU, from the files run.sh wrote in this folder: medians.
import glob, json, os
here = os.path.dirname(os.path.abspath(__file__))
k, t = {}, {}
for f in glob.glob(os.path.join(here, "kiln_*.json")):
    for r in json.load(open(f)):
        if r["device"] == "cpu": k[(r["workload"], r["threads"], r["method"])] = r["median_us"]
for f in glob.glob(os.path.join(here, "torch_*_t*.json")):
    d = json.load(open(f))
    for r in (d["rows"] if isinstance(d, dict) else d):
        if "median_us" in r: t[(r["workload"], r["threads"], r["method"])] = r["median_us"]
print("| workload | threads | kiln fused | kiln compiled | hand xsimd | Eigen per row | torch eager | torch.compile | compiled / hand | torch.compile / kiln compiled |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
ms = lambda v: f"{v / 1000:.2f} ms" if v else "-"
for w in ("chain16M", "bias_gelu", "softmax", "layernorm"):
    for th in (1, 2):
        kc, h, tc = k.get((w, th, "compiled")), k.get((w, th, "hand")), t.get((w, th, "compile"))
        print(f"| {w} | {th} | {ms(k.get((w, th, 'fused')))} | {ms(kc)} | {ms(h)} | {ms(k.get((w, th, 'eigen_rows')))} | "
              f"{ms(t.get((w, th, 'eager')))} | {ms(tc)} | {f'{kc / h:.2f}' if kc and h else '-'} | {f'{tc / kc:.2f}x' if kc and tc else '-'} |")
