#!/usr/bin/env bash
# session 18 call 2: the CUDA suite and the unit tests on the GPU after the export/ONNX move (every
# test binary as tests/gpu.sh runs it: GPU cases not skipped), then the differential fuzzer on CUDA
set -o pipefail
P=.device-build/s18
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc KILN_TEST_CUDA_ARCHS=80,90
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/full.tar.gz -C /tmp/b
for t in cuda_runtime cuda_nvrtc cuda_blas cuda_ops cuda_semantics autograd bert nn nn_io ops_sweep shape_ops compile compile_semantics core expr errors cpu_backend export ir cuda_codegen; do
  echo "== $t"; timeout 300 /tmp/b/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > /tmp/log_$t.txt 2>&1; echo "rc=$? at $((SECONDS - t0)) s"
  grep -E "test cases:|Status" /tmp/log_$t.txt | tail -2; grep -E "ERROR|FAILED" /tmp/log_$t.txt | head -5
done
n=800; p=16; per=$(( n / p ))
echo "== fuzz on CUDA: $n programs in $p processes"
for i in $(seq 0 $((p - 1))); do KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((i * per)) KILN_FUZZ_GRAPHS=$per timeout 200 /tmp/b/t/kiln_test_fuzz > /tmp/fuzz_$i.log 2>&1 & done
wait; cat /tmp/fuzz_*.log | grep -E "test cases:|Status" | sort | uniq -c
echo "done at $((SECONDS - t0)) s"; date
