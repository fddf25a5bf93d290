#!/usr/bin/env bash
# session 20 call 2: ResNet-18's training test on 24 x 24 images (CUDA, 5 runs) and the NVRTC test's message
set -o pipefail
P=.device-build/s20  # this folder's scripts were run from there
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
mkdir -p /work && [ -e /work/main ] || ln -s "$PWD" /work/main
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
for i in 1 2 3; do /tmp/b/t/kiln_unit_tests_1 --source-file=*/test_autograd.cpp --test-case="ResNet-18 trains*" --success 2>&1 | grep -E "lc == |values: CHECK\( *[0-9.]+ ==|test cases:" | grep -E "values|test cases" | tr '\n' ' ' | cut -c1-600; echo; done
KILN_TEST_CUDA_SASS=1 /tmp/b/t/kiln_cuda_tests_1 --source-file=*/test_cuda_codegen.cpp --test-case="row kernels*" 2>&1 | grep -E "MESSAGE|test cases"
KILN_TEST_CUDA_SASS=0 /tmp/b/t/kiln_cuda_tests_1 --source-file=*/test_cuda_codegen.cpp --test-case="row kernels*" 2>&1 | grep -E "MESSAGE|test cases"
