# Sums an ncu --csv report (gpu__time_duration.sum) by kernel-name class.
import csv, sys, re, collections
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
tot = collections.defaultdict(float); cnt = collections.Counter(); names = collections.defaultdict(float)
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", "")); unit = r["Metric Unit"]
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    n = r["Kernel Name"]
    names[n[:110]] += us; cnt[n[:110]] += 1
s = sum(names.values())
print(f"total {s:.1f} us over {sum(cnt.values())} kernels")
for n, v in sorted(names.items(), key=lambda kv: -kv[1])[:45]:
    print(f"{v:9.1f} us {cnt[n]:4d}x  {n}")
