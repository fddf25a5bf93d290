#!/usr/bin/env bash
# session 24, call 1 (2 x H200): HEAD's 2-GPU path (window buckets zeroed by fill_dense, 0a1eb1d):
# the 2-GPU suite; the BERT layer with and without windows, 1 GPU beside; then the die test
# with windows, a stack of each process still alive after 20 s (cuda-gdb), before kilnrun's grace ends.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s24
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; which cuda-gdb gdb
KILN_CACHE_DIR=/tmp/kcd timeout 300 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/dist.log | head -30
for w in "bert_layer_train 32"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  echo -n "1 GPU: "; timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  for r in 1 2; do for v in 0 1; do echo -n "round $r symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done; done
done
echo "at $((SECONDS - t0)) s"
for round in 1 2; do
  [ $((SECONDS - t0)) -gt 420 ] && { echo "stopped at $((SECONDS - t0)) s"; break; }
  mode=reduce_overhead
  KILN_LOGS=dist timeout 90 bash tools/kilnrun --nproc 2 --grace 60 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model bert --symmetric 1 > $OUT/die_$round.txt 2>&1 &
  sleep 25
  for pid in $(pgrep -f "^[^ ]*t/kiln_dist_worker die"); do
    echo "round $round: pid $pid alive after 25 s: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-120)"
    timeout 60 cuda-gdb -batch -p $pid -ex "info threads" -ex "thread apply all bt 25" > $OUT/stack_${round}_$pid.txt 2>&1 || timeout 60 gdb -batch -p $pid -ex "thread apply all bt 25" > $OUT/stack_${round}_$pid.txt 2>&1
    grep -E "^#|Thread" $OUT/stack_${round}_$pid.txt | head -60
  done
  wait
  echo "round $round done at $((SECONDS - t0)) s: $(grep -E 'EXPECTED|aborted|kilnrun|DistError' $OUT/die_$round.txt | cut -c1-160 | head -5 | tr '\n' '|')"
done
gzip $OUT/*.log $OUT/*.txt 2>/dev/null; date
