#!/usr/bin/env bash
# session 14, call 7 (4 x H200): after this session's DataParallel changes, kiln reduce_overhead
# against PyTorch DDP + torch.compile reduce-overhead on 1, 2 and 4 GPUs (bench/ddp_compare.sh; the
# BERT layer 32 x 128 and ResNet-18 64 per GPU), then kiln_test_dist's multi_gpu4 suite.
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
nvidia-smi -L; date; t0=$SECONDS; mkdir -p /tmp/ddp
for w in "bert_layer_train 32 _b32" "resnet18_train 64 _r64"; do set -- $w
  MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=$1 BATCH=$2 TAG=$3 bash bench/ddp_compare.sh $P/bd /tmp/ddp 2 4 > /tmp/ddp/log$3.txt 2>&1; echo "$1 rc=$? at $((SECONDS - t0)) s"
  grep -v "^\s*$" /tmp/ddp/report$3.md | head -14; tar czf $OUT/ddp.tar.gz -C /tmp ddp
done
timeout 150 $P/t/kiln_test_dist --test-suite=multi_gpu4 --no-skip > $OUT/dist.log 2>&1; echo "== dist multi_gpu4 rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -20
gzip $OUT/dist.log; date
