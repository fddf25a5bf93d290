#!/usr/bin/env bash
# session 25, call 3 (2 x H200): the memsets before some cuBLASLt GEMMs (8 per step; on 2 GPUs each
# costs ~2.8 us more than on 1): their sizes (the tracer now records them), and the BERT layer with
# cuBLASLt's workspace at 0 (KILN_CUBLASLT_WORKSPACE_KB=0: only algorithms needing none) against 32 MiB.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
for ws in 32768 0; do
  export KILN_CUBLASLT_WORKSPACE_KB=$ws
  CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g1ws$ws LD_PRELOAD=/tmp/libct.so timeout 60 $B --ddp 2>&1 | grep "DataParallel"
  CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g2ws$ws LD_PRELOAD=/tmp/libct.so timeout 60 bash tools/kilnrun --nproc 2 $B --symmetric 1 2>&1 | grep "DataParallel"
done
unset KILN_CUBLASLT_WORKSPACE_KB
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > /tmp/tr/timeline.txt 2>&1; grep -E "^==|span|spans|Allreduce|AllReduce" /tmp/tr/timeline.txt
for f in /tmp/tr/list/*.tsv; do echo "$f: $(grep -cE 'memset' $f) memsets: $(grep -E 'memset|memcpy' $f | awk -F'\t' '{printf "%s (%s us) | ", $5, $4}')"; done
tar czf $OUT/traces.tar.gz -C /tmp/tr .
echo "traces at $((SECONDS - t0)) s"
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.3"
for r in 1 2; do for ws in 32768 0; do
  echo -n "round $r ws=$ws KB 1 GPU: "; KILN_CUBLASLT_WORKSPACE_KB=$ws timeout 100 $B 2>&1 | grep -E "GPU|rror" | head -2
  echo -n "round $r ws=$ws KB 2 GPUs symmetric=1: "; KILN_CUBLASLT_WORKSPACE_KB=$ws timeout 100 bash tools/kilnrun --nproc 2 $B --symmetric 1 2>&1 | grep -E "GPU|rror" | head -2
done; done
date
