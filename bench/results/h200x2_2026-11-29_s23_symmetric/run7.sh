#!/usr/bin/env bash
# session 23, call 7 (2 x H200): the window buckets' 1/world scale moved from NCCL's stream to the
# compute stream's wait, 16-byte vectors; --symmetric 0 / 1 alternating (BERT layer, MLP); then
# kiln_test_dist's 2-GPU suite.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
for w in "bert_layer_train 32" "mlp_train 0"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  for round in 1 2; do for v in 0 1; do
    echo -n "symmetric=$v: "; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2
  done; done
  echo "at $((SECONDS - t0)) s"
done
KILN_CACHE_DIR=/tmp/kcd timeout 300 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
gzip $OUT/*.log; date
