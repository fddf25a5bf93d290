#!/usr/bin/env bash
# session 6: the GPU suites after moving nn's bodies into layers_impl.hpp / conv_impl.hpp and the
# library-op registrations into the program loader (no logic change intended: this checks it)
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
for t in cuda_ops cuda_semantics autograd nn export; do
  [ -x $B/tests/kiln_test_$t ] || { echo "== $t not built"; continue; }
  echo "== $t"; timeout 240 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/test_$t.log 2>&1; echo "rc=$?"
  grep -E "test cases:|assertions:|ERROR" $OUT/test_$t.log | head -8
done
echo "== kiln_bench GPU model rows"; timeout 240 $B/bench/kiln_bench --no-cpu --filter resnet18,bert_layer,mlp --json $OUT/gpu_rows.json > $OUT/gpu_rows.txt 2>&1; echo "rc=$?"
grep -E "^(resnet18|bert_layer|mlp)" $OUT/gpu_rows.txt | head -30; tail -5 $OUT/gpu_rows.txt
date
