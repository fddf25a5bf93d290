#!/usr/bin/env bash
# session 7: the GPU suites after (1) export's fresh constant names, (2) eager row composites as
# compiled programs; then the GPU rows they touch, the composites on and off in one run
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in cuda_ops cuda_semantics autograd nn export compile; do
  [ -x $B/tests/kiln_test_$t ] || { echo "== $t not built"; continue; }
  echo "== $t"; timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/test_$t.log 2>&1; echo "rc=$?"
  grep -E "test cases:|assertions:|ERROR" $OUT/test_$t.log | head -8
done
for round in 1 2; do
  for ec in 0 1; do
    echo "== kiln_bench GPU rows, KILN_EAGER_COMPOSITES=$ec, round $round"
    KILN_EAGER_COMPOSITES=$ec timeout 150 $B/bench/kiln_bench --no-cpu --filter softmax,layernorm,bert_layer_f32 --json $OUT/gpu_rows_ec${ec}_r$round.json > $OUT/gpu_rows_ec${ec}_r$round.txt 2>&1; echo "rc=$?"
    grep -E "^(softmax|layernorm|bert_layer_f32) " $OUT/gpu_rows_ec${ec}_r$round.txt | grep -E " (eager|fused|compiled) " | head -12
  done
done
echo "== kiln_bench GPU model rows (bf16 export groups)"; timeout 200 $B/bench/kiln_bench --no-cpu --filter mlp_bf16,bert_layer_bf16 --json $OUT/gpu_bf16.json > $OUT/gpu_bf16.txt 2>&1; echo "rc=$?"
grep -E "^(bert_layer|mlp)|FAILED" $OUT/gpu_bf16.txt | head -30; tail -3 $OUT/gpu_bf16.txt
date
