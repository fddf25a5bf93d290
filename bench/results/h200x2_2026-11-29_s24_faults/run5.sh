#!/usr/bin/env bash
# session 24, call 5 (2 x H200): what call 4 left: kiln_unit_tests_1 again (test_errors' absent
# device is cuda:63 now: cuda:1 exists here); kiln_unit_tests_2 without test_fuzz (call 4 ran the
# fuzzer's default 2,000 programs in one process and ran out of time before nn, ops_sweep and
# shape_ops); the CUDA fuzzer as tests/gpu.sh runs it (2,000 programs, fixed seeds, 16 processes);
# compute-sanitizer memcheck of the CUDA runtime, BLAS, semantics and ops tests while time is left.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s24
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kc5
export KILN_RUN=$PWD/tools/kilnrun KILN_TEST_CUDA_ARCHS=80,90 KILN_TEST_CUDA_SASS=1
date; t0=$SECONDS
S=no_gpu,download,multi_gpu4
timeout 120 $P/t/kiln_unit_tests_1 --test-suite-exclude=$S --no-skip > $OUT/unit1.log 2>&1; echo "== kiln_unit_tests_1 rc=$? at $((SECONDS - t0)) s: $(grep -E 'test cases:' $OUT/unit1.log | tail -1 | tr -s ' ')"; grep -E "ERROR|FATAL" -A3 $OUT/unit1.log | head -12
timeout 200 $P/t/kiln_unit_tests_2 --test-suite-exclude=$S --no-skip --source-file-exclude=*/test_fuzz.cpp > $OUT/unit2.log 2>&1; echo "== kiln_unit_tests_2 without test_fuzz rc=$? at $((SECONDS - t0)) s: $(grep -E 'test cases:' $OUT/unit2.log | tail -1 | tr -s ' ')"; grep -E "ERROR|FATAL|MESSAGE" -A2 $OUT/unit2.log | head -16
n=2000; p=16; per=$(( (n + p - 1) / p ))
for i in $(seq 0 $((p - 1))); do
  KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((i * per)) KILN_FUZZ_GRAPHS=$per timeout 110 $P/t/kiln_unit_tests_2 --source-file=*/test_fuzz.cpp > $OUT/fuzz_$i.log 2>&1 &
done
wait
cat $OUT/fuzz_*.log > $OUT/fuzz.log; rm -f $OUT/fuzz_[0-9]*.log
grep -oE "compile: [^;]*; eager: [^(]*" $OUT/fuzz.log | sort | uniq -c; echo "$(grep -c 'Status: SUCCESS' $OUT/fuzz.log) of $p fuzz processes passed; fuzz done at $((SECONDS - t0)) s"
for spec in "kiln_cuda_tests_1 test_cuda_runtime.cpp" "kiln_cuda_tests_1 test_cuda_blas.cpp" "kiln_cuda_tests_0 test_cuda_semantics.cpp" "kiln_cuda_tests_0 test_cuda_ops.cpp"; do
  set -- $spec
  left=$((420 - (SECONDS - t0))); [ $left -gt 30 ] || { echo "== memcheck $2: no time left"; continue; }
  timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 $P/t/$1 --source-file=*/$2 -tce='*out of memory*' > $OUT/memcheck_$2.log 2>&1
  echo "== memcheck $2 rc=$? $(grep -E "ERROR SUMMARY|test cases:" $OUT/memcheck_$2.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
done
gzip $OUT/*.log; date
