#!/usr/bin/env bash
# session 28, call 3: the lookahead fixed (logs), the A/B, timelines, test_cuda_ops (but conv cases)
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s28
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
KILN_LOGS=gemm,fusion,recompiles,graph_breaks timeout 100 $P/t/kiln_test_cuda_ops -tc="*prefetches the next*" > $OUT/test_ahead.log 2>&1; rc=$?
echo "test rc=$rc"; grep -v "^\s*$" $OUT/test_ahead.log | head -40
KILN_LOGS=gemm timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 > $OUT/bert_gemm_log.txt 2>&1; grep -c "prefetches" $OUT/bert_gemm_log.txt; grep -E "next product|prefetches" $OUT/bert_gemm_log.txt | head -12
echo "logs at $((SECONDS - t0)) s"
[ $rc = 0 ] || exit 0
for rep in 1 2 3; do for a in 0 1; do
  echo "-- ahead=$a b1: $(KILN_CUDA_PREFETCH_AHEAD=$a timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per|rror" | awk '{print $4}' | tr '\n' ' ')"
done; done
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti || echo "cupti build failed"
mkdir -p /tmp/tr
for a in 0 1; do
  KILN_CUDA_PREFETCH_AHEAD=$a CUPTI_TRACE_MATCH=bert_prof CUPTI_TRACE_OUT=/tmp/tr/b1_ahead$a LD_PRELOAD=/tmp/libct.so timeout 120 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per" | tail -1
done
python3 tools/cupti_timeline.py --list /tmp/tr /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; grep -A12 "^==" $OUT/timeline.txt | head -40
mkdir -p $OUT/tsv; cp /tmp/tr/*.tsv $OUT/tsv/
echo "timeline at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kct timeout 100 $P/t/kiln_test_cuda_ops -tce="*conv*,*ResNet*,*fuzz*" > $OUT/test_cuda_ops.log 2>&1
echo "== test_cuda_ops rc=$? $(grep -E "test cases:|assertions:" $OUT/test_cuda_ops.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
grep -E "ERROR|FATAL" -A8 $OUT/test_cuda_ops.log | head -20
date
