#!/usr/bin/env bash
# session 23, call 4 (2 x H200): DDPOptions::symmetric_memory (opt-in; buckets >= 2 MB in windows,
# sum + 1/world) against the default, alternating; kiln_test_dist's 2-GPU suite; then
# bench/ddp_compare.sh for the BERT layer at 32 per GPU with the windows on, torch in the same run.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
for w in "bert_layer_train 32 2" "mlp_train 0 1"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  for round in $(seq $3); do for v in 0 1; do
    echo -n "symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2
  done; done
  echo "at $((SECONDS - t0)) s"
done
KILN_CACHE_DIR=/tmp/kcd timeout 330 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
mkdir -p $P/bench && ln -sfn $PWD/$P/t/kiln_ddp_bench $P/bench/kiln_ddp_bench
KILN_DDP_WINDOWS=1 MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=bert_layer_train BATCH=32 timeout 420 bash bench/ddp_compare.sh $P $OUT/cmp 2 2>&1 | grep -vE "^\s*$" | tail -25
echo "at $((SECONDS - t0)) s"
gzip $OUT/*.log; date
