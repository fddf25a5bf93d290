#!/usr/bin/env bash
# session 16, call 6: the final build. First compiled step into an empty kernel cache, the build
# before this session (mem_probe_old, HEAD a657c6d) against this one alternating (a throwaway run
# first: the first process of a machine also loads cuDNN's libraries from disk); the GPU suites;
# eager against compiled for ResNet-18
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s16
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
rm -rf /tmp/kcw; KILN_CACHE_DIR=/tmp/kcw $P/t/mem_probe resnet18_train cuda > /dev/null 2>&1; echo "throwaway at $((SECONDS - t0)) s"
for w in bert_layer_train resnet18_train; do for v in old new old new; do
  b=$P/t/mem_probe; [ $v = old ] && b=$P/t/mem_probe_old
  rm -rf /tmp/kc_$v; echo "-- $w $v: $(KILN_CACHE_DIR=/tmp/kc_$v KILN_LOGS=compile_times,cache $b $w cuda 2>&1 | grep -cE "kiln:cache\] compiled") NVRTC compiles; $(KILN_CACHE_DIR=/tmp/kc_$v.2 KILN_LOGS=compile_times $b $w cuda 2>&1 | grep -E "first compiled" | tr '\n' ' ')"
done; done
echo "at $((SECONDS - t0)) s"
LOG=$OUT/tests.log
for t in cuda_ops autograd nn; do KILN_CACHE_DIR=/tmp/kct timeout 300 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; done
rm -f $OUT/t.log; gzip $LOG
KILN_CACHE_DIR=/tmp/kcs $P/t/stale_probe resnet18_train 6 2>&1 | tail -7
date
