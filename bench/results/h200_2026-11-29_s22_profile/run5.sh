#!/usr/bin/env bash
# session 22, call 5: the few-row shape with max_autotune leaving small few-row kernels untimed.
# bert_prof old / new (b1), kiln_bench old / new alternating on bert_base_b1_bf16 (max_autotune
# against reduce_overhead), then GPU rows old / new, then test_cuda_ops on the GPU.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
for rep in 1 2; do for b in bert_prof_old bert_prof; do
  echo "-- $b b1: $(KILN_CACHE_DIR=/tmp/kc timeout 60 $P/t/$b reduce_overhead bf16 b1 2>&1 | grep -E "us per|rror" | tail -2 | awk '{print $4}' | tr '\n' ' ')"
done; done
for rep in 1 2 3; do for b in kiln_bench_old kiln_bench; do
  KILN_CACHE_DIR=/tmp/kc_${b}_$rep KILN_LOGS=autotune timeout 120 $P/t/$b --no-cpu --filter bert_base_b1_bf16 > $OUT/${b}_b1_$rep.txt 2>&1
  echo "$b $rep rc=$?: $(grep -E "^  bert_base_b1_bf16 +throughput" $OUT/${b}_b1_$rep.txt)"
done; done
echo "b1 at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc8 KILN_LOGS=autotune timeout 120 $P/t/kiln_bench --no-cpu --filter bert_base_b8x128_bf16 > $OUT/kiln_bench_b8.txt 2>&1
echo "b8x128 rc=$?: $(grep -E "^  bert_base_b8x128_bf16 +throughput" $OUT/kiln_bench_b8.txt) at $((SECONDS - t0)) s"
timeout 150 python3 bench/anchors/torch_anchor.py --filter bert_base_b1_bf16 --json $OUT/torch_b1.json > $OUT/torch_b1.txt 2>&1; echo "torch b1 rc=$? at $((SECONDS - t0)) s"; grep -E "anchor\] bert|ok=" $OUT/torch_b1.txt | head -8
F=softmax,rowsum_short,layernorm,sincos_scalar,mlp_bf16,bert_layer_bf16
for b in kiln_bench_old kiln_bench; do
  left=$((440 - (SECONDS - t0))); [ $left -gt 30 ] || { echo "$b: no time left"; continue; }
  KILN_CACHE_DIR=/tmp/kcr_$b timeout $left $P/t/$b --no-cpu --filter $F --json $OUT/$b.json > $OUT/$b.txt 2>&1; echo "$b rc=$? at $((SECONDS - t0)) s"
  grep -E "^  [a-z_0-9]+ +throughput" $OUT/$b.txt
done
KILN_CACHE_DIR=/tmp/kct timeout 150 $P/t/kiln_cuda_tests_0 --source-file=*/test_cuda_ops.cpp > $OUT/test_cuda_ops.log 2>&1
echo "== test_cuda_ops rc=$? $(grep -E "test cases:|assertions:" $OUT/test_cuda_ops.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
grep -E "ERROR|FATAL" -A8 $OUT/test_cuda_ops.log | head -30
date
