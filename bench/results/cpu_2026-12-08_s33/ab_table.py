# Side-by-side medians (us) of the bench runs of this folder: old (4f09bd1) and new, alternating.
import sys
def load(f):
    d = {}
    for l in open(f):
        p = l.split()
        if len(p) >= 4 and p[2].isdigit():
            try: d[(p[0], p[1], p[2])] = float(p[3])
            except ValueError: pass
    return d
names = ['old_1', 'new_1', 'old_2', 'new_2']
runs = {k: load(f'bench_{k}.txt') for k in names}
print(f"{'workload method threads':34s} " + ' '.join(f'{n:>9s}' for n in names))
for k in runs['old_1']:
    v = [runs[r].get(k, float('nan')) for r in names]
    print(f"{' '.join(k):34s} " + ' '.join(f'{x:9.1f}' for x in v))
