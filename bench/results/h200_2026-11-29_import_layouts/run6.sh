#!/usr/bin/env bash
# session 17 call 6: the rest of the CUDA suite on the final code (semantics, runtime, nvrtc, compile, compile_semantics, ir, blas, cuda_ops, nn, export), compute-sanitizer memcheck on the new GEMM case, the ResNet-18 example
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
for t in ${TESTS:-}; do echo "== test $t"; timeout 400 /tmp/b/t/kiln_test_$t 2>&1 | tail -3; echo "at $((SECONDS - t0)) s"; done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
echo "== compute-sanitizer memcheck: the seq-first GEMM case"; timeout 300 $CS --tool memcheck /tmp/b/t/kiln_test_cuda_blas -tc="*does not merge*" 2>&1 | tail -4
[ -x /tmp/b/t/example_resnet18 ] && { echo "== example_resnet18 --cuda"; timeout 200 /tmp/b/t/example_resnet18 --cuda 2>&1 | tail -4; }
date
