#!/usr/bin/env bash
# session 23, call 8 (2 x H200): with symmetric windows, host waits poll the group's failure and
# ncclCommAbort runs on a thread of its own: the die test (BERT layer, --symmetric 1) three times
# per mode; the 2-GPU suite (now with that case); the BERT layer and MLP with and without windows.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
for round in 1 2 3; do for mode in compiled reduce_overhead; do
  KILN_LOGS=dist timeout 60 bash tools/kilnrun --nproc 2 --grace 25 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model bert --symmetric 1 > $OUT/die_${round}_$mode.txt 2>&1
  echo "$round $mode rc=$? at $((SECONDS - t0)) s: $(grep -cE 'all-reduced' $OUT/die_${round}_$mode.txt) starts; $(grep -E 'EXPECTED|aborted|kilnrun' $OUT/die_${round}_$mode.txt | cut -c1-160 | tr '\n' '|')"
done; done
for w in "bert_layer_train 32" "mlp_train 0"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  for v in 0 1; do echo -n "symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done
done
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kcd timeout 300 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/dist.log | head -30
gzip $OUT/*.log $OUT/*.txt; date
