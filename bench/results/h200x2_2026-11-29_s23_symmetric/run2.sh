#!/usr/bin/env bash
# session 23, call 2 (2 x H200): DataParallel's buckets in symmetric windows, summed and scaled by
# 1/world on NCCL's stream (default) against ordinary buckets and NCCL's avg (KILN_DDP_WINDOWS=0),
# alternating, reduce_overhead; then kiln_test_dist's 2-GPU suite (both paths).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
for w in "bert_layer_train 32" "resnet18_train 64" "mlp_train 0"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -3
  rounds=3; [ $1 = bert_layer_train ] || rounds=1
  for round in $(seq $rounds); do
    for v in 0 1; do
      echo -n "windows=$v: "; KILN_DDP_WINDOWS=$v timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
    done
  done
  echo "at $((SECONDS - t0)) s"
done
KILN_CACHE_DIR=/tmp/kcd timeout 300 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download,multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
gzip $OUT/*.log; date
