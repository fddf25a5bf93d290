#!/usr/bin/env bash
# session 10, call 1: GPU suites on the new build (one kernel per parameter update, stored writes,
# combo launches, kernel texts named by place); the ResNet-18 step old (HEAD 0cf2f49) vs new, and
# new with KILN_CUDA_COMBO=0, each cold (fresh kernel cache) then timed.
cd "$(dirname "$0")" && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s10
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops autograd nn compile cuda_semantics export; do KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -30; done
rm -f $OUT/t.log
for v in old new combo0 new; do
  b=$v; e=""; [ $v = combo0 ] && { b=new; e="KILN_CUDA_COMBO=0"; }
  echo "-- $v reduce_overhead 16"; rm -rf /tmp/kc_$v; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 90 $P/$b/resnet_prof reduce_overhead 16 2>&1 | grep -E "us per|first|kernels|rror"
done
echo "-- new, compiled 16 (combo log)"; KILN_LOGS=combo KILN_CACHE_DIR=/tmp/kc_new timeout 60 $P/new/resnet_prof compiled 16 2>&1 | grep -E "us per|kernels|rror|combo" | sort | uniq -c | sort -rn | head -12
date
