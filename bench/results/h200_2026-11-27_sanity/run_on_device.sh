#!/usr/bin/env bash
# session 5: the GPU suites after this session's CPU changes (SIMD math, thread pool, row kernels)
# and last session's cuda/graph_exec.hpp include; then the GPU bench rows of the CPU-side workloads
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in cuda_ops cuda_semantics autograd; do
  echo "== $t"; timeout 240 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/test_$t.log 2>&1; echo "rc=$?"
  grep -E "test cases:|assertions:|ERROR" $OUT/test_$t.log | head -8
done
n=600; p=$(nproc); per=$(( (n + p - 1) / p )); echo "== fuzz on CUDA: $n programs in $p processes"
for i in $(seq 0 $((p - 1))); do
  KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((90000 + i * per)) KILN_FUZZ_GRAPHS=$per timeout 200 $B/tests/kiln_test_fuzz > $OUT/fuzz_$i.log 2>&1 &
done
wait
cat $OUT/fuzz_*.log > $OUT/fuzz.log; rm -f $OUT/fuzz_[0-9]*.log
grep -c "Status: SUCCESS" $OUT/fuzz.log; grep -c "Status: FAILURE" $OUT/fuzz.log; grep -m5 -E "ERROR|wrong" $OUT/fuzz.log
echo "== kiln_bench GPU rows"; timeout 200 $B/bench/kiln_bench --no-cpu --filter chain64M,bias_gelu,softmax,layernorm --json $OUT/gpu_rows.json > $OUT/gpu_rows.txt 2>&1; echo "rc=$?"
grep -E "^(chain64M|bias_gelu|softmax|layernorm|copy) " $OUT/gpu_rows.txt | head -30
date
