import json,sys,statistics as st
def load(fs):
    rows={}
    for f in fs:
        for r in json.load(open(f)):
            k=(r['workload'],r['method'],r['device'],r.get('threads',0))
            rows.setdefault(k,[]).append(r['median_us'])
    return {k:st.median(v) for k,v in rows.items()}
b=load(sys.argv[1].split(','));a=load(sys.argv[2].split(','))
rat=[]
for k in sorted(b):
    if k in a and b[k]>0:
        r=a[k]/b[k];rat.append(r)
        print(f"{k[0]:28s} {k[1]:18s} {k[2]:7s} t{k[3]:<2} before {b[k]:11.2f} after {a[k]:11.2f}  {r:6.3f}")
print("rows",len(rat),"median after/before",round(st.median(rat),3),"min",round(min(rat),3),"max",round(max(rat),3))
