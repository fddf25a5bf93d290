#!/usr/bin/env bash
# session 25, call 6 (2 x H200): after the twin rule (cuBLASLt's workspace-free twin of a choice that
# needs a workspace only for its tile scheduler) and select's gradient as one elementwise where:
# the cuBLASLt and autograd tests on the GPU; CUPTI timelines of the BERT layer's step (1 GPU
# DataParallel, 2 GPUs with windows); the BERT layer on 1 and 2 GPUs (windows 0/1, two rounds);
# kiln_test_dist's 2-GPU suite; then bench/ddp_compare.sh with torch in the same run.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
for e in kiln_test_cuda_blas kiln_test_autograd; do
  timeout 120 $P/t/$e --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/$e.log 2>&1; echo "== $e rc=$? $(grep -E 'test cases:' $OUT/$e.log | tr -s ' ') at $((SECONDS - t0)) s"
  grep -E "ERROR|FATAL|run without a workspace" -A3 $OUT/$e.log | head -20
done
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g1ddp LD_PRELOAD=/tmp/libct.so timeout 60 $B --ddp 2>&1 | grep "DataParallel"
CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/g2w1 LD_PRELOAD=/tmp/libct.so timeout 60 bash tools/kilnrun --nproc 2 $B --symmetric 1 2>&1 | grep "DataParallel"
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > /tmp/tr/timeline.txt 2>&1; grep -E "^==|span|AllReduce" /tmp/tr/timeline.txt
for f in /tmp/tr/list/*.tsv; do echo "$f: $(grep -cE 'memset' $f) memsets, $(grep -cE 'memcpy' $f) memcpys"; done
tar czf $OUT/traces.tar.gz -C /tmp/tr .
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.3"
for r in 1 2; do
  echo -n "round $r 1 GPU: "; timeout 100 $B 2>&1 | grep -E "GPU|rror" | head -2
  for v in 0 1; do echo -n "round $r 2 GPUs symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done
done
echo "rows at $((SECONDS - t0)) s"
timeout 200 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -20
mkdir -p $P/bench && ln -sfn $PWD/$P/t/kiln_ddp_bench $P/bench/kiln_ddp_bench
left=$((575 - (SECONDS - t0)))
KILN_DDP_WINDOWS=1 MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=bert_layer_train BATCH=32 timeout $left bash bench/ddp_compare.sh $P $OUT/cmp 2 2>&1 | grep -vE "^\s*$" | tail -22
echo "at $((SECONDS - t0)) s"
gzip $OUT/*.log; date
