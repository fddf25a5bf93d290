#!/usr/bin/env bash
# session 22, call 6: the unit and CUDA tests on the GPU at HEAD (every test case but the no-GPU, download,
# multi-GPU and dist ones; the three unity executables in parallel), then the CUDA random-DAG
# fuzzer, 400 programs in 16 processes (fixed seeds 0..399)
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
for e in kiln_unit_tests_0 kiln_unit_tests_1 kiln_unit_tests_2 kiln_cuda_tests_0 kiln_cuda_tests_1; do
  KILN_CACHE_DIR=/tmp/kc_$e timeout 400 $P/t/$e --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --source-file-exclude=*/test_dist.cpp > $OUT/$e.log 2>&1 &
done
wait
for e in kiln_unit_tests_0 kiln_unit_tests_1 kiln_unit_tests_2 kiln_cuda_tests_0 kiln_cuda_tests_1; do echo "== $e: $(grep -E "test cases:|assertions:|Status|skipped by" $OUT/$e.log | tr -s ' ' | tr '\n' ' ')"; grep -E "ERROR|FATAL" -A6 $OUT/$e.log | head -30; done
echo "unit at $((SECONDS - t0)) s"
n=400; p=16; per=$(( (n + p - 1) / p ))
for i in $(seq 0 $((p - 1))); do
  KILN_CACHE_DIR=/tmp/kc_f$i KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((i * per)) KILN_FUZZ_GRAPHS=$per timeout 200 $P/t/kiln_unit_tests_0 --source-file=*/test_fuzz.cpp > $OUT/fuzz_$i.log 2>&1 &
done
wait
cat $OUT/fuzz_*.log > $OUT/fuzz.log; rm -f $OUT/fuzz_[0-9]*.log
echo "fuzz: $(grep -c "Status: SUCCESS" $OUT/fuzz.log) of $p processes succeeded; $(grep -ciE "mismatch" $OUT/fuzz.log) mismatch lines"
grep -E "test cases:" $OUT/fuzz.log | sort | uniq -c
gzip $OUT/fuzz.log
echo "at $((SECONDS - t0)) s"; date
