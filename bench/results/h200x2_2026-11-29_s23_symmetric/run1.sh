#!/usr/bin/env bash
# session 23, call 1 (2 x H200): DataParallel's buckets in NCCL symmetric windows (ncclMemAlloc +
# ncclCommWindowRegister), all-reduced with avg (as before) or with an unscaled sum (timing only:
# KILN_DDP_EXPERIMENT_SUM), against ordinary buckets (KILN_DDP_WINDOWS=0); the BERT layer at 32 x 128
# per GPU, reduce_overhead, alternating; then kiln_test_dist (windows on) with its multi_gpu suite.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.3 --batch 32"
timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -3
KILN_LOGS=dist NCCL_DEBUG=INFO timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B > $OUT/logrun.txt 2>&1
grep -E "GPU|rror" $OUT/logrun.txt | head -3; grep -ciE "symmetric|window" $OUT/logrun.txt; grep -E "kiln.*(window|all-reduced)" $OUT/logrun.txt | sort | uniq -c | head -20
for round in 1 2; do
  for v in "KILN_DDP_WINDOWS=0" "KILN_DDP_WINDOWS=1" "KILN_DDP_WINDOWS=0 KILN_DDP_EXPERIMENT_SUM=1" "KILN_DDP_WINDOWS=1 KILN_DDP_EXPERIMENT_SUM=1"; do
    echo "-- $v"; env $v timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  done
  echo "at $((SECONDS - t0)) s"
done
B="--workloads resnet18_train --methods reduce_overhead --min-time 0.3 --batch 64"
for v in "KILN_DDP_WINDOWS=0" "KILN_DDP_WINDOWS=1 KILN_DDP_EXPERIMENT_SUM=1"; do
  echo "-- resnet $v"; env $v timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
done
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kcd timeout 150 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
gzip $OUT/*.log $OUT/*.txt; date
