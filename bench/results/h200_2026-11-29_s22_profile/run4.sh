#!/usr/bin/env bash
# session 22, call 4: is max_autotune slower than reduce_overhead at batch 1 with the new row shape
# (call 3: 285.8 against 254.0 us, old binary 254.7 against 258.6)? kiln_bench old / new
# alternating on bert_base_b1_bf16 (each a new process: GEMMs and row shapes timed again), with
# KILN_LOGS=autotune for the choices.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
for rep in 1 2 3; do for b in kiln_bench_old kiln_bench; do
  KILN_CACHE_DIR=/tmp/kc_$b KILN_LOGS=autotune timeout 120 $P/t/$b --no-cpu --filter bert_base_b1_bf16 > $OUT/${b}_$rep.txt 2>&1
  echo "$b $rep rc=$?: $(grep -E "^  bert_base_b1_bf16 +throughput" $OUT/${b}_$rep.txt)"
done; done
echo "at $((SECONDS - t0)) s"; date
