#!/usr/bin/env bash
# session 13, call 4 (2 x H200): DataParallel's bucket size, kiln only: the BERT layer (32 x 128 per
# GPU) and ResNet-18 (64 per GPU) on 2 GPUs with buckets of 25 (the default, torch's), 10, 5 and 2.5 MB
# (first bucket 1 MB), and the 1-GPU steps for the scaling.
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
for w in "bert_layer_train 32" "resnet18_train 64"; do set -- $w
  timeout 100 $P/t/kiln_ddp_bench --workloads $1 --methods reduce_overhead --min-time 0.2 --batch $2 2>&1 | grep -E "GPU|rror" | head -3
  for mb in 25 10 5 2.5; do
    echo "-- bucket $mb MB"; timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench --workloads $1 --methods reduce_overhead --min-time 0.2 --batch $2 --bucket-mb $mb 2>&1 | grep -E "GPU|rror" | head -3
  done
  echo "at $((SECONDS - t0)) s"
done
date
