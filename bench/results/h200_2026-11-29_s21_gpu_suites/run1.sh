#!/usr/bin/env bash
# session 21 call 1 (bc1fe71, build/s1 binaries): the CUDA random-DAG fuzzer, 2,000 programs in 16
# processes (fixed seeds 0..1999), then compute-sanitizer memcheck of the CUDA runtime, BLAS,
# semantics and ops tests (as tests/gpu.sh, on the unity executables)
set -o pipefail
P=.device-build/s21  # (carried: the packed binaries and ONNX/protobuf .so files)
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
mkdir -p /work && [ -e /work/main ] || ln -s "$PWD" /work/main
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
n=2000; p=16; per=$(( (n + p - 1) / p ))
echo "== fuzz on CUDA: $n programs in $p processes"
for i in $(seq 0 $((p - 1))); do
  KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((i * per)) KILN_FUZZ_GRAPHS=$per timeout 280 /tmp/b/t/kiln_unit_tests_0 --source-file=*/test_fuzz.cpp > $OUT/fuzz_$i.log 2>&1 &
done
wait
cat $OUT/fuzz_*.log > $OUT/fuzz.log; rm -f $OUT/fuzz_[0-9]*.log
grep -E "^fuzz|programs|test cases:|mismatch|seed" $OUT/fuzz.log | sort | uniq -c | head -30
grep -c "Status: SUCCESS" $OUT/fuzz.log; echo "fuzz done at $((SECONDS - t0)) s"
for spec in "kiln_cuda_tests_1 test_cuda_runtime.cpp" "kiln_cuda_tests_1 test_cuda_blas.cpp" "kiln_cuda_tests_0 test_cuda_semantics.cpp" "kiln_cuda_tests_0 test_cuda_ops.cpp"; do
  set -- $spec
  left=$((570 - (SECONDS - t0))); [ $left -gt 20 ] || { echo "== memcheck $2: no time left"; continue; }
  timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/b/t/$1 --source-file=*/$2 -tce='*out of memory*' > $OUT/memcheck_$2.log 2>&1
  echo "== memcheck $2 rc=$? $(grep -E "ERROR SUMMARY|test cases:" $OUT/memcheck_$2.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
done
date
