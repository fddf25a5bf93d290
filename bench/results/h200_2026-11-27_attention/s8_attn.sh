#!/usr/bin/env bash
# session 8: one-kernel attention on CUDA: the tests, then the BERT rows with it off / on
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
timeout 250 $B/tests/kiln_test_cuda_ops -tc="*scaled_dot_product_attention*,*nn blocks*" --no-skip > $OUT/test_attn.log 2>&1; echo "== attn rc=$? $(grep -E 'test cases:' $OUT/test_attn.log | tr -s ' ')"
grep -E "ERROR|CHECK|with context|B [0-9]" $OUT/test_attn.log | head -40
for fa in ${FAS:-0 1}; do
  KILN_FUSED_ATTENTION=$fa timeout 250 $B/bench/kiln_bench --no-cpu --filter ${FILTER:-bert} --json $OUT/bert_fa${fa}.json > $OUT/bert_fa${fa}.txt 2>&1; echo "== fa=$fa rc=$?"
  grep -E "^bert" $OUT/bert_fa${fa}.txt | grep -E " (eager|compiled|reduce_overhead) " | head -24
done
date
