#!/usr/bin/env bash
# session 13, call 3 (2 x H200): data-parallel training after the fuser's sibling reductions and
# recomputation, the shared conv weight copy and one-pass batch statistics: kiln vs PyTorch DDP +
# torch.compile reduce-overhead on 1 and 2 GPUs (ResNet-18 64 per GPU, the BERT layer 32 x 128),
# bench/ddp_compare.sh; then kiln_test_dist with its multi_gpu suite.
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; date; t0=$SECONDS
MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=resnet18_train BATCH=64 TAG=_r64 bash bench/ddp_compare.sh $P/bd $OUT 2 > $OUT/ddp_r64.log 2>&1; echo "r64 rc=$? at $((SECONDS - t0)) s"
grep -v "^\s*$" $OUT/report_r64.md | head -12
MIN_TIME=0.2 TORCH_METHODS=compile_ro KILN_METHODS=reduce_overhead WORKLOADS=bert_layer_train BATCH=32 TAG=_b32 bash bench/ddp_compare.sh $P/bd $OUT 2 > $OUT/ddp_b32.log 2>&1; echo "b32 rc=$? at $((SECONDS - t0)) s"
grep -v "^\s*$" $OUT/report_b32.md | head -12
KILN_CACHE_DIR=/tmp/kcd timeout 200 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
gzip $OUT/*.log; date
