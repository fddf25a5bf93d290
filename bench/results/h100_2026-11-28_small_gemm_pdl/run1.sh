#!/usr/bin/env bash
# session 11, call 1: where the bert-base forward's time goes, kiln (ncu per kernel) and torch (profiler).
P=.device-build/s11
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for s in b1 b8x128; do
  timeout 60 $P/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per|first|kernels|rror"
  timeout 120 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/bert_prof compiled bf16 $s > $OUT/ncu_$s.csv 2>/dev/null; echo "ncu rc=$?"
  python3 $P/summarize.py $OUT/ncu_$s.csv 2>&1 | head -30
  gzip $OUT/ncu_$s.csv
  echo "at $((SECONDS - t0)) s"
done
for s in b1 b8x128; do timeout 150 python3 $P/torch_prof.py $s 2>&1 | grep -v Warning | tail -50; echo "at $((SECONDS - t0)) s"; done
date
