#!/usr/bin/env bash
# session 16, call 5: the first-run precompile (a dry run collects every kernel's text, compiled in
# parallel) and the warm-up text fix (PDL entry): first compiled step into empty caches with
# KILN_CUDA_PRECOMPILE=0 and 1; the GPU suites; eager against compiled; kiln_bench's training rows
# into an empty cache
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s16
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
for w in mlp_train bert_layer_train resnet18_train; do for pc in 0 1 0 1; do
  rm -rf /tmp/kc_$pc; echo "-- $w KILN_CUDA_PRECOMPILE=$pc: $(KILN_CUDA_PRECOMPILE=$pc KILN_CACHE_DIR=/tmp/kc_$pc KILN_LOGS=compile_times $P/t/mem_probe $w cuda 2>&1 | grep -E "compile_times|first compiled" | tr '\n' ' ')"
done; done
echo "at $((SECONDS - t0)) s"
LOG=$OUT/tests.log
for t in cuda_ops autograd compile nn cuda_semantics; do KILN_CACHE_DIR=/tmp/kct timeout 300 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; done
rm -f $OUT/t.log; gzip $LOG
KILN_CACHE_DIR=/tmp/kcs $P/t/stale_probe resnet18_train 6 2>&1 | tail -1
rm -rf /tmp/kcb; KILN_CACHE_DIR=/tmp/kcb timeout 300 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln_bench rc=$? at $((SECONDS - t0)) s"
grep -E "^(mlp|bert|resnet)|first step" $OUT/kiln_train.txt | head -30
date
