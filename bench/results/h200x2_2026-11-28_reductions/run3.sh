#!/usr/bin/env bash
# session 12, call 3 (2 x H200): kiln_test_dist (its multi_gpu suite on both GPUs), then data-parallel
# training kiln vs PyTorch DDP + torch.compile on 1 and 2 GPUs at the compute-bound batches (BERT
# layer 32 x 128 per GPU, ResNet-18 64 per GPU).
cd "$(dirname "$0")" && rm -rf t old new bd && tar xzf bins.tar.gz && ln -s t new && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s12
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; date; t0=$SECONDS
KILN_CACHE_DIR=/tmp/kcd timeout 200 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=bert_layer_train BATCH=32 TAG=_b32 bash bench/ddp_compare.sh $P/bd $OUT 2 > $OUT/ddp_b32.log 2>&1; echo "ddp b32 rc=$? at $((SECONDS - t0)) s"
MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=resnet18_train BATCH=64 TAG=_r64 bash bench/ddp_compare.sh $P/bd $OUT 2 > $OUT/ddp_r64.log 2>&1; echo "ddp r64 rc=$? at $((SECONDS - t0)) s"
cat $OUT/report_b32.md $OUT/report_r64.md 2>/dev/null | grep -v "^\s*$" | head -60
gzip $OUT/dist.log
date
