#!/usr/bin/env bash
# session 13, call 5 (2 x H200): where the BERT layer's data-parallel overhead (~180 us per step on 2
# GPUs) goes: DataParallel on one process (--ddp: the wrapper, no communication), and 2 GPUs with
# NCCL limited to 2, 4, 8 channels (fewer SMs taken from the backward's kernels).
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.2 --batch 32"
timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
timeout 100 $P/t/kiln_ddp_bench $B --ddp 2>&1 | grep -E "GPU|rror" | head -2
for ch in default 2 4 8 16; do
  echo "-- NCCL channels $ch"
  if [ $ch = default ]; then timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  else NCCL_MAX_NCHANNELS=$ch NCCL_MIN_NCHANNELS=1 timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2; fi
done
echo "-- 2 GPUs, --bucket-mb 1000 (one bucket)"; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --bucket-mb 1000 --first-bucket-mb 1000 2>&1 | grep -E "GPU|rror" | head -2
echo "at $((SECONDS - t0)) s"; date
