#!/usr/bin/env bash
# session 24, call 4 (2 x H200): every test of the unity executables at 2e00dfb on the GPU machine, as
# tests/gpu.sh runs them (the suites no_gpu, download and multi_gpu4 left out, --no-skip: a GPU test
# that cannot run fails), one executable after another; the test cases skipped are counted against
# the cases the left-out suites hold.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s24
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kc4
export KILN_RUN=$PWD/tools/kilnrun KILN_TEST_CUDA_ARCHS=80,90 KILN_TEST_CUDA_SASS=1
date; t0=$SECONDS; nvidia-smi -L
S=no_gpu,download,multi_gpu4
for e in kiln_cuda_tests_0 kiln_cuda_tests_1 kiln_unit_tests_0 kiln_unit_tests_1 kiln_unit_tests_2; do
  left=$((560 - (SECONDS - t0))); [ $left -gt 20 ] || { echo "== $e: no time left"; continue; }
  timeout $left $P/t/$e --test-suite-exclude=$S --no-skip > $OUT/$e.log 2>&1; rc=$?
  expect=$($P/t/$e --test-suite=$S --no-skip --count 2>/dev/null | sed -n 's/.*filters: *\([0-9]*\).*/\1/p')
  echo "== $e rc=$rc at $((SECONDS - t0)) s: $(grep -E 'test cases:' $OUT/$e.log | tail -1 | tr -s ' ') (left-out suites hold ${expect:-?})"
  grep -E "ERROR|FATAL|error:" -A4 $OUT/$e.log | head -24
done
gzip $OUT/*.log; date
