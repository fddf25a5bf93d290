#!/usr/bin/env bash
# session 7: where a warm second process's first call goes (issue 19: <= 50 ms)
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=/tmp/kcw
B=build/dev/bench/kiln_bench
echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset}"; which nsys ncu 2>/dev/null
for name in mlp_bf16 bert_layer_bf16 mlp_f32 softmax; do
  $B --first-call $name > /dev/null 2>&1   # cold: fills the cache
  for pre in 0 1; do
    for i in 1 2 3; do
      if [ $pre = 1 ]; then export KILN_BENCH_PREWARM_BLAS=1; else unset KILN_BENCH_PREWARM_BLAS; fi
      echo "== $name prewarm_blas=$pre run $i: $(KILN_LOGS=compile_times $B --first-call $name 2>&1 | grep -E 'first_call_us|compile_times|compile of' | tr '\n' ' ')"
    done
  done
done
