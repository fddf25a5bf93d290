#!/usr/bin/env bash
# session 8: the GPU suites at the attention commit, memcheck and racecheck of the attention test
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in cuda_ops cuda_semantics autograd nn compile export; do
  timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t_$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(grep -E 'test cases:' $OUT/t_$t.log | tr -s ' ')"
  grep -E "ERROR|FAILED" $OUT/t_$t.log | head -5
done
for tool in memcheck racecheck; do
  timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool $tool $B/tests/kiln_test_cuda_ops -tc="*scaled_dot_product_attention*" --no-skip > $OUT/sanitizer_$tool.log 2>&1; echo "== $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases:' $OUT/sanitizer_$tool.log | tr -s ' ' | tr '\n' ' ')"
done
date
