#!/usr/bin/env bash
# session 25, call 7 (only if a 4-GPU kind is lent): the BERT layer at 32 x 128 per GPU on 1, 2 and 4
# GPUs, kiln (windows on) and torch DDP + torch.compile in one run; then kiln's ResNet-18 at 64.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS; nvidia-smi -L
mkdir -p $P/bench && ln -sfn $PWD/$P/t/kiln_ddp_bench $P/bench/kiln_ddp_bench
KILN_DDP_WINDOWS=1 MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=bert_layer_train BATCH=32 timeout 330 bash bench/ddp_compare.sh $P $OUT/cmp 2 4 2>&1 | grep -vE "^\s*$|^W1|rank[0-9]" | tail -14
echo "at $((SECONDS - t0)) s"
left=$((560 - (SECONDS - t0)))
[ $left -gt 60 ] && KILN_DDP_WINDOWS=1 MIN_TIME=0.2 TORCH_METHODS=none KILN_METHODS=reduce_overhead WORKLOADS=resnet18_train BATCH=64 TAG=_r64 timeout $left bash bench/ddp_compare.sh $P $OUT/cmp 2 4 2>&1 | grep -E "^\|" | tail -6
date
