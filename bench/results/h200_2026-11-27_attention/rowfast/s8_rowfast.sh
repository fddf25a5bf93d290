#!/usr/bin/env bash
# session 8: the row groups' last-launch fast path: GPU suites, the CUDA fuzzer, host time per step before / after
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in cuda_ops compile nn; do timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t_$t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t_$t.log | tr -s " ")"; grep -E "ERROR" -A3 $OUT/t_$t.log | head -8; done
KILN_FUZZ_DEVICE=cuda timeout 150 $B/tests/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/t_fuzz_cuda.log 2>&1; echo "== fuzz cuda rc=$? $(grep -E "test cases:|programs" $OUT/t_fuzz_cuda.log | tr -s " " | head -3)"
for v in old new old new; do ./.device-build/hp/hostprof_$v > $OUT/hostprof_$v.txt 2>&1; echo "== $v"; grep -E "^== |row" $OUT/hostprof_$v.txt | head -12; done
date
