#!/usr/bin/env bash
# session 25, call 5 (2 x H200): cuBLASLt algorithms chosen without a workspace (no 4-byte memset
# before the kernel) only where the heuristic's first needs one and the choice without keeps its
# shape: KILN_CUBLASLT_NO_WORKSPACE=0 (today), 1 (same id/tile/stages/split-k/cluster), 2 (any
# without split-k). The decisions (KILN_LOGS=gemm) for the BERT layer's training step; the BERT
# layer on 1 and 2 GPUs (windows on); kiln_bench's rows with matrix products under each policy.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && tar xzf kb.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.3"
KILN_CUBLASLT_NO_WORKSPACE=1 KILN_LOGS=gemm timeout 60 $B 2>&1 | grep -E "gemm" | sort | uniq -c | head -40
for r in 1 2; do for pol in 0 1 2; do
  echo -n "round $r policy $pol 1 GPU: "; KILN_CUBLASLT_NO_WORKSPACE=$pol timeout 100 $B 2>&1 | grep -E "GPU|rror" | head -2
  echo -n "round $r policy $pol 2 GPUs symmetric=1: "; KILN_CUBLASLT_NO_WORKSPACE=$pol timeout 100 bash tools/kilnrun --nproc 2 $B --symmetric 1 2>&1 | grep -E "GPU|rror" | head -2
done; done
echo "ddp at $((SECONDS - t0)) s"
F=gemm_,linears_,mlp,bert,resnet18
for pol in 0 1 2; do
  left=$((560 - (SECONDS - t0))); [ $left -gt 60 ] || { echo "== policy $pol: no time left"; continue; }
  KILN_CACHE_DIR=/tmp/kb$pol KILN_CUBLASLT_NO_WORKSPACE=$pol KILN_LOGS=gemm timeout $left $P/t/kiln_bench --no-cpu --min-time 0.1 --filter $F --json $OUT/pol$pol.json > $OUT/pol$pol.txt 2>&1
  echo "== policy $pol rc=$? at $((SECONDS - t0)) s"; grep -iE "error" $OUT/pol$pol.txt | head -5
done
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
def load(p):
    try: rows = json.load(open(p))
    except Exception as e: print(p, e); return {}
    return {(r.get("workload"), r.get("method")): r for r in rows}
d = [load(f"{o}/pol{i}.json") for i in range(3)]
for k in sorted(set(d[0]) & set(d[1]), key=str):
    t = [x.get(k, {}).get("throughput_us") or x.get(k, {}).get("median_us") or 0 for x in d]
    if t[0] and t[0] > 0: print(f"{k[0]:24s} {k[1]:20s} policy 0 {t[0]:9.1f}  1 {t[1]:9.1f} ({t[1] / t[0]:5.3f})  2 {t[2]:9.1f} ({(t[2] / t[0]) if t[2] else 0:5.3f})")
PY
gzip $OUT/*.txt; date
