#!/usr/bin/env bash
# session 9, call 2: the GPU suites on the new build (max-pool gradient kernels, split reductions in
# one launch), the CUDA fuzzer, and ResNet-18 training steps: old (HEAD 671f30d) / mid (max pool) / new.
export LD_LIBRARY_PATH=$PWD/.device-build/s9/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev; P=.device-build/s9; LOG=$OUT/tests.log
for t in cuda_ops autograd nn compile; do timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ")"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -30; done
rm -f $OUT/t.log
KILN_FUZZ_DEVICE=cuda KILN_FUZZ_GRAPHS=300 timeout 200 $B/tests/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/fuzz.log 2>&1; echo "== fuzz cuda rc=$? $(grep -E "test cases:" $OUT/fuzz.log | tr -s " ")"; grep -iE "programs|fail" $OUT/fuzz.log | head -8
date
for v in old mid new; do for m in compiled reduce_overhead; do echo "-- $v $m"; timeout 100 $P/$v/resnet_prof $m 16 2>&1 | grep -E "us per|kernels|rror"; done; done
echo "-- new, KILN_CUDA_SPLIT_FINISH=0"; KILN_CUDA_SPLIT_FINISH=0 timeout 100 $P/new/resnet_prof reduce_overhead 16 2>&1 | grep -E "us per|kernels|rror"
date
