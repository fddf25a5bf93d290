#!/usr/bin/env bash
# session 7: the GPU suites at b0463d1 binaries (composites compiled on CUDA too), summaries only
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L
B=build/dev
for t in cuda_ops cuda_semantics autograd nn compile export; do
  timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > /tmp/t_$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(grep -E 'test cases:' /tmp/t_$t.log | tr -s ' ')"
  grep -E "ERROR|FAILED" /tmp/t_$t.log | head -5
done
cat /tmp/t_*.log | grep -E "test cases:|assertions:" > $OUT/summaries.txt
# then, in two more calls (the commands of tests/gpu.sh):
#   compute-sanitizer --tool memcheck --error-exitcode 9 build/dev/tests/kiln_test_{cuda_ops,cuda_semantics} -tce='*out of memory*'
#     -> memcheck_*.log: 25/25 and 5/5 cases, ERROR SUMMARY: 0 errors
#   the CUDA fuzzer, 2000 programs in 16 processes (KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=... KILN_FUZZ_GRAPHS=125)
#     -> fuzz_cuda.log: seeds 0..1999, 0 wrong results, 0 errors, 0 crashes, compiled and eager
