#!/usr/bin/env bash
# session 7: composites of expression operands (softmax(scores * scale), layer_norm(x + r)) evaluated
# once, then the compiled program: the BERT layer's fused rows, composites off / on alternately
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in nn compile; do
  timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/test_$t.log 2>&1; echo "== $t rc=$? $(grep -E 'test cases:' $OUT/test_$t.log | tr -s ' ')"
done
for r in 1 2; do
  for ec in 0 1; do
    KILN_EAGER_COMPOSITES=$ec timeout 200 $B/bench/kiln_bench --no-cpu --filter bert_layer --json $OUT/bert_ec${ec}_r$r.json > $OUT/bert_ec${ec}_r$r.txt 2>&1; echo "== ec=$ec r=$r rc=$?"
    grep -E "^bert_layer" $OUT/bert_ec${ec}_r$r.txt | grep -E " (eager|fused|compiled) " | head -6
  done
done
date
