#!/usr/bin/env bash
# session 16, call 4 (2 x H200: NS=2; no 4-GPU kind was lent then): the data-parallel ResNet-18 rows again after the tracer fix (their
# earlier figures came from a compiled step that kept its first step's conv weights): kiln
# reduce_overhead against PyTorch DDP + torch.compile reduce-overhead, 1, 2 and 4 GPUs, 64 and 16 per GPU
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s16
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
nvidia-smi -L; date; t0=$SECONDS; mkdir -p /tmp/ddp
for w in "resnet18_train 64 _r64" "resnet18_train 16 _r16"; do set -- $w
  MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=$1 BATCH=$2 TAG=$3 bash bench/ddp_compare.sh $P/bd /tmp/ddp ${NS:-2 4} > /tmp/ddp/log$3.txt 2>&1; echo "$1 $2 rc=$? at $((SECONDS - t0)) s"
  grep -v "^\s*$" /tmp/ddp/report$3.md | head -14; tar czf $OUT/ddp.tar.gz -C /tmp ddp
done
date
