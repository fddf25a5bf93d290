#!/usr/bin/env bash
# session 25, call 2 (2 x H200): where the BERT layer's 2-GPU step (32 x 128 per GPU, reduce_overhead)
# loses its 90 us now: CUPTI timelines of DataParallel on 1 GPU and on 2 GPUs with and without
# symmetric windows; then the bench rows (1 GPU; 2 GPUs windows 0/1, two rounds).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
KILN_LOGS=dist timeout 60 $B --ddp 2>&1 | grep -i "bucket\|DataParallel"
CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g1ddp LD_PRELOAD=/tmp/libct.so timeout 60 $B --ddp 2>&1 | grep "DataParallel"
for v in 0 1; do CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g2w$v LD_PRELOAD=/tmp/libct.so timeout 60 bash tools/kilnrun --nproc 2 $B --symmetric $v 2>&1 | grep "DataParallel"; done
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > /tmp/tr/timeline.txt 2>&1; cat /tmp/tr/timeline.txt | head -120
tar czf $OUT/traces.tar.gz -C /tmp/tr .
echo "traces at $((SECONDS - t0)) s"
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.3"
echo -n "1 GPU: "; timeout 100 $B 2>&1 | grep -E "GPU|rror" | head -2
for r in 1 2; do for v in 0 1; do echo -n "round $r symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done; done
date
