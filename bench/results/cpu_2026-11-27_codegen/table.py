# Tabulates the CPU rows of this folder: per workload and threads, fused and compiled with
# KILN_CPU_CODEGEN=off (the tile interpreter) and sync (generated C++), medians of the rounds' medians.
import glob, json, statistics, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob("*_r*.json")):
    mode = f.split("_")[0]
    for r in json.load(open(f)):
        if r["device"] != "cpu" or r["method"] not in ("fused", "compiled", "eager"): continue
        rows[(r["workload"], r["threads"], r["method"], mode)].append(r["median_us"])
print("| workload | threads | eager | fused | compiled, interpreter | compiled, generated C++ | generated / interpreter | generated / fused |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({(w, t) for (w, t, m, mo) in rows})
for w, t in keys:
    def med(m, mo): 
        v = rows.get((w, t, m, mo)); return statistics.median(v) if v else float("nan")
    e = statistics.median(rows.get((w, t, "eager", "off"), []) + rows.get((w, t, "eager", "sync"), []) or [float("nan")])
    f = statistics.median(rows.get((w, t, "fused", "off"), []) + rows.get((w, t, "fused", "sync"), []) or [float("nan")])
    ci, cg = med("compiled", "off"), med("compiled", "sync")
    print(f"| {w} | {t} | {e/1000:.2f} ms | {f/1000:.2f} ms | {ci/1000:.2f} ms | {cg/1000:.2f} ms | {cg/ci:.2f} | {cg/f:.2f} |")
