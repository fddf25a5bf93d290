#!/usr/bin/env bash
# session 7: ONNX-imported bf16 programs after the import runs Cast/op/Cast sandwiches on the bf16 values
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
echo "== export"; timeout 200 $B/tests/kiln_test_export --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/test_export.log 2>&1; echo "rc=$?"
grep -E "test cases:|assertions:|ERROR" $OUT/test_export.log | head -8
for r in 1 2; do
  echo "== round $r"; timeout 250 $B/bench/kiln_bench --no-cpu --filter mlp_bf16,bert_layer_bf16,bert_layer_f32 --json $OUT/import_r$r.json > $OUT/import_r$r.txt 2>&1; echo "rc=$?"
  grep -E "^(bert_layer|mlp)|FAILED" $OUT/import_r$r.txt | grep -E " (compiled|onnx_import|loaded|fused|eager) " | head -30
done
date
