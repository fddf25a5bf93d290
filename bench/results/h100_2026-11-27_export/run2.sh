#!/usr/bin/env bash
# session of 2026-11-27, call 2 (issue 16): kiln_bench's model rows on the H100 again after the input
# checks stopped building strings per call (loaded vs compiled host time)
set -o pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
B=build/dev
nvidia-smi --query-gpu=name --format=csv,noheader
for f in mlp_f32 bert_layer_f32; do
  timeout 150 $B/bench/kiln_bench --no-cpu --min-time 0.1 --filter $f --json $OUT/bench2_$f.json > $OUT/bench2_$f.txt 2>&1; echo "$f rc=$?"
  grep -E "^$f " $OUT/bench2_$f.txt | grep -E " (eager|compiled|loaded|reduce_overhead) " | head -6
done
