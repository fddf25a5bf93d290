#!/usr/bin/env bash
# session 14, call 5 (2 x H200): is a stream's priority captured into CUDA graph kernel nodes;
# CUPTI timelines of the BERT layer on 2 GPUs with NCCL held to 4 / 8 CTAs and pushed to 32.
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
nvcc -O2 -arch=sm_90 $P/prio.cu -o /tmp/prio -lcuda && /tmp/prio
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
for e in "NCCL_MAX_CTAS=4" "NCCL_MAX_CTAS=8" "NCCL_MIN_CTAS=32 NCCL_MAX_CTAS=32"; do
  t=$(echo $e | tr -d ' =_' | tr 'A-Z' 'a-z')
  env $e CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/$t LD_PRELOAD=/tmp/libct.so timeout 60 bash tools/kilnrun --nproc 2 $B --json /tmp/j.json 2>&1 | grep "DataParallel:" | sed "s/^/$e: /"
  python3 tools/cupti_timeline.py --list /tmp/tr/list $(ls /tmp/tr/$t.*.csv | head -1) > /tmp/tr/$t.txt 2>&1; sed -n 2,9p /tmp/tr/$t.txt
done
tar czf $OUT/traces.tar.gz -C /tmp/tr list; echo "at $((SECONDS - t0)) s"
