#!/usr/bin/env bash
# session 25, call 7 (2 x H200): the batched matmul's gradient for a transposed view operand made in
# that layout (attention's k^T: the packed projection's gradient then reads k's contiguously):
# test_autograd on the GPU; a CUPTI timeline of the 1-GPU step; the BERT layer on 1 and 2 GPUs
# (windows 0/1, two rounds); kiln_test_dist's 2-GPU suite.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
timeout 100 $P/t/kiln_test_autograd --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/autograd.log 2>&1; echo "== autograd rc=$? $(grep -E 'test cases:' $OUT/autograd.log | tr -s ' ') at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A3 $OUT/autograd.log | head -12
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g1ddp LD_PRELOAD=/tmp/libct.so timeout 60 $B --ddp 2>&1 | grep "DataParallel"
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > /tmp/tr/timeline.txt 2>&1; head -12 /tmp/tr/timeline.txt
awk -F'\t' 'NR>1 && $3>560 && $3<800' /tmp/tr/list/*.tsv
tar czf $OUT/traces.tar.gz -C /tmp/tr .
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.3"
for r in 1 2; do
  echo -n "round $r 1 GPU: "; timeout 100 $B 2>&1 | grep -E "GPU|rror" | head -2
  for v in 0 1; do echo -n "round $r 2 GPUs symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done
done
echo "rows at $((SECONDS - t0)) s"
left=$((330 - (SECONDS - t0)))
[ $left -gt 60 ] && { timeout $left $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -20; }
gzip $OUT/*.log; date
