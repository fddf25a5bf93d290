#!/usr/bin/env bash
# session 22, call 3: the row-kernel shape for few rows (half the values per thread where rows <
# SMs) and the exact-gelu pass with a vector per thread (no grid cap): bert_prof old / new
# alternating (b1: the row change; 8 x 128: the gelu pass), kiln_bench GPU rows old / new
# (softmax, layernorm, bias_gelu, the BERT and MLP rows), then the CUDA tests on the GPU.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
for s in b1 b8x128; do for rep in 1 2 3; do for b in bert_prof_old bert_prof; do
  echo "-- $b $s: $(timeout 60 $P/t/$b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -2 | awk '{print $4}' | tr '\n' ' ')"
done; done; done
echo "bert_prof at $((SECONDS - t0)) s"
F=softmax,layernorm,bias_gelu,bert_layer_bf16,bert_base_b1_bf16,bert_base_b8x128_bf16,mlp_bf16
for b in kiln_bench_old kiln_bench; do
  timeout 200 $P/t/$b --no-cpu --filter $F --json $OUT/$b.json > $OUT/$b.txt 2>&1; echo "$b rc=$? at $((SECONDS - t0)) s"
  grep -E "^  [a-z_0-9]+ +throughput" $OUT/$b.txt
done
for spec in "kiln_cuda_tests_0 test_cuda_ops.cpp" "kiln_cuda_tests_0 test_cuda_semantics.cpp" "kiln_cuda_tests_1 test_cuda_blas.cpp"; do
  set -- $spec
  left=$((585 - (SECONDS - t0))); [ $left -gt 20 ] || { echo "== $2: no time left"; continue; }
  timeout $left $P/t/$1 --source-file=*/$2 > $OUT/test_$2.log 2>&1
  echo "== $2 rc=$? $(grep -E "test cases:|assertions:" $OUT/test_$2.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
  grep -E "ERROR|FATAL" -A6 $OUT/test_$2.log | head -30
done
date
