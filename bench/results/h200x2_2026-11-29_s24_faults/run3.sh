#!/usr/bin/env bash
# session 24, call 3 (2 x H200): with windows, a failed group whose ncclCommAbort does not return
# within 10 s ends the process with status 70 instead of hanging: the 2-GPU suite (with its new die
# case, 4 runs); then the die test with windows 6 more times (BERT layer, both modes, KILN_LOGS=dist);
# the BERT layer's step with and without windows (nothing on the step's path changed).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s24
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
KILN_CACHE_DIR=/tmp/kcd timeout 400 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist_faults.log 2>&1; echo "== dist (2-GPU suite) rc=$? $(grep -E "test cases:" $OUT/dist_faults.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "MESSAGE|runs raised|ERROR|FATAL" -A3 $OUT/dist_faults.log | head -30
for round in 1 2 3; do for mode in compiled reduce_overhead; do
  [ $((SECONDS - t0)) -gt 480 ] && { echo "stopped at $((SECONDS - t0)) s"; break 2; }
  s=$SECONDS
  KILN_LOGS=dist timeout 60 bash tools/kilnrun --nproc 2 --grace 40 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model bert --symmetric 1 > $OUT/die_${round}_$mode.txt 2>&1
  echo "die $round $mode rc=$? in $((SECONDS - s)) s: $(grep -E 'EXPECTED|status 70|kilnrun' $OUT/die_${round}_$mode.txt | cut -c1-150 | head -4 | tr '\n' '|')"
done; done
B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.3 --batch 32"
for v in 0 1; do echo -n "symmetric=$v: "; timeout 60 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done
echo "at $((SECONDS - t0)) s"
gzip $OUT/*.log $OUT/*.txt 2>/dev/null; date
