#!/usr/bin/env bash
# session 28, call 1: the next product's weights prefetched to L2 (KILN_CUDA_PREFETCH_AHEAD, 1 = on,
# the default; 0 = off), alternating in one call: bert_prof b1 bf16 reduce_overhead, kiln_bench
# bert_base_b1_bf16, a CUPTI timeline of each, the torch anchor b1, then the CUDA op tests.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
nvcc -O2 -arch=sm_90 .device-build/s28/l2_prefetch.cu -o /tmp/l2p && /tmp/l2p | tee $OUT/l2_prefetch.txt
P=.device-build/s28
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
for rep in 1 2 3; do for a in 0 1; do
  echo "-- ahead=$a b1: $(KILN_CUDA_PREFETCH_AHEAD=$a timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per|rror" | awk '{print $4}' | tr '\n' ' ')"
done; done
echo "prof at $((SECONDS - t0)) s"
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti || echo "cupti build failed"
mkdir -p /tmp/tr
for a in 0 1; do
  KILN_CUDA_PREFETCH_AHEAD=$a CUPTI_TRACE_MATCH=bert_prof CUPTI_TRACE_OUT=/tmp/tr/b1_ahead$a LD_PRELOAD=/tmp/libct.so timeout 120 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per" | tail -1
done
python3 tools/cupti_timeline.py --list /tmp/tr /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; grep -A12 "^==" $OUT/timeline.txt | head -40
tar czf $OUT/tsv.tar.gz -C /tmp/tr $(cd /tmp/tr && ls *.tsv)
echo "timeline at $((SECONDS - t0)) s"
for rep in 1 2; do for a in 0 1; do
  KILN_CUDA_PREFETCH_AHEAD=$a KILN_CACHE_DIR=/tmp/kcb timeout 120 $P/t/kiln_bench --no-cpu --filter bert_base_b1_bf16,mlp_bf16 > $OUT/kiln_b1_a${a}_$rep.txt 2>&1
  echo "ahead=$a $rep rc=$?:"; grep -E "^  (bert_base_b1_bf16|mlp_bf16) +(throughput|latency)" $OUT/kiln_b1_a${a}_$rep.txt
done; done
echo "bench at $((SECONDS - t0)) s"
timeout 150 python3 bench/anchors/torch_anchor.py --filter bert_base_b1_bf16 --json $OUT/torch_b1.json > $OUT/torch_b1.txt 2>&1; echo "torch b1 rc=$? at $((SECONDS - t0)) s"; grep -E "anchor\] bert|ok=" $OUT/torch_b1.txt | head -8
for t in cuda_ops cuda_blas; do
  KILN_CACHE_DIR=/tmp/kct timeout 150 $P/t/kiln_test_$t > $OUT/test_$t.log 2>&1
  echo "== test_$t rc=$? $(grep -E "test cases:|assertions:" $OUT/test_$t.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
  grep -E "ERROR|FATAL" -A8 $OUT/test_$t.log | head -30
done
date
