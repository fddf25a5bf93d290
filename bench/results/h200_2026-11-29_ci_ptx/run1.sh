#!/usr/bin/env bash
# session 20 call 1: the CUDA tests (NVRTC to cubins for sm_80 and sm_90, the refactored compile
# path, the allocator's index check) and the unit tests' GPU cases (ResNet-18 training on 16 x 16)
set -o pipefail
P=.device-build/s20  # this folder's scripts were run from there
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
export KILN_TEST_CUDA_SASS=1 KILN_TEST_CUDA_ARCHS=80,90
mkdir -p /work && [ -e /work/main ] || ln -s "$PWD" /work/main
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
for e in kiln_cuda_tests_0 kiln_cuda_tests_1; do echo "== $e"; timeout 300 /tmp/b/t/$e 2>&1 | grep -E "^\[kiln\]|test cases:|assertions:|FAILED|ERROR|compiling .* sources" | sort | uniq -c | head -20; echo "at $((SECONDS - t0)) s"; done
echo "== autograd (GPU cases)"; timeout 200 /tmp/b/t/kiln_unit_tests_1 --source-file=*/test_autograd.cpp 2>&1 | tail -4; echo "at $((SECONDS - t0)) s"
for e in kiln_unit_tests_1 kiln_unit_tests_2; do echo "== $e (GPU cases: suites without dist, fuzz)"; timeout 200 /tmp/b/t/$e --source-file-exclude=*/test_dist.cpp,*/test_autograd.cpp,*/test_ops_sweep.cpp,*/test_simd_math.cpp 2>&1 | grep -E "test cases:|assertions:|FAILED|ERROR|^\[kiln\]" | head -12; echo "at $((SECONDS - t0)) s"; done
echo "done at $((SECONDS - t0)) s"; date
