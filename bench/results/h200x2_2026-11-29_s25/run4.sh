#!/usr/bin/env bash
# session 25, call 4 (H200): kiln_bench's GPU rows with matrix products, cuBLASLt's workspace 32 MiB
# (the default) against 0 (KILN_CUBLASLT_WORKSPACE_KB=0), one after the other in one call.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && tar xzf kb.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
date; t0=$SECONDS
F=gemm_,linears_,mlp,bert,resnet18
for ws in 32768 0; do
  KILN_CACHE_DIR=/tmp/kc$ws KILN_CUBLASLT_WORKSPACE_KB=$ws timeout 270 $P/t/kiln_bench --no-cpu --min-time 0.1 --filter $F --json $OUT/ws$ws.json > $OUT/ws$ws.txt 2>&1
  echo "== ws=$ws KB rc=$? at $((SECONDS - t0)) s"; grep -iE "error|skip" $OUT/ws$ws.txt | head -5
done
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
def load(p):
    try: d = json.load(open(p))
    except Exception as e: print(p, e); return {}
    rows = d["rows"] if isinstance(d, dict) else d
    return {(r.get("workload"), r.get("method")): r for r in rows}
a, b = load(f"{o}/ws32768.json"), load(f"{o}/ws0.json")
for k in sorted(set(a) & set(b), key=str):
    ta, tb = a[k].get("throughput_us") or a[k].get("median_us"), b[k].get("throughput_us") or b[k].get("median_us")
    if ta and tb and ta > 0 and tb > 0: print(f"{k[0]:24s} {k[1]:20s} 32MiB {ta:10.1f} us  0: {tb:10.1f} us  {tb / ta:6.3f}")
PY
date
