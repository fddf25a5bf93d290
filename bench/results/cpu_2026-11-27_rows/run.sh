#!/usr/bin/env bash
# kiln's rows (eager, fused, compiled = generated C++, and the hand-written anchors of
# bench/hand_cpu.hpp) and torch eager / torch.compile on the CPU, one workload at a time, both sides
# in one session, 1 and 2 threads.
#   PYTHON=/path/to/python-with-torch KILN_BENCH=build/sep/bench/kiln_bench bash run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
PYTHON=${PYTHON:-python3}
KILN_BENCH=${KILN_BENCH:-$root/build/sep/bench/kiln_bench}
for w in softmax layernorm bias_gelu chain16M; do
  KILN_CPU_CODEGEN=sync "$KILN_BENCH" --no-gpu --min-time 0.5 --filter "$w" --json "$here/kiln_$w.json" > "$here/kiln_$w.txt" 2>&1
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$PYTHON" "$root/bench/anchors/torch_anchor.py" --device cpu --filter "$w" --no-rates \
      --methods eager,compile --min-time 0.5 --json "$here/torch_${w}_t$t.json" > "$here/torch_${w}_t$t.txt" 2>&1
  done
done
