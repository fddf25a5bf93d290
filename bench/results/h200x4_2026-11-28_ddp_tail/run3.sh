#!/usr/bin/env bash
# session 14, call 3 (2 x H200): NCCL's all-reduce bandwidth by itself (torch.distributed, eager and
# in a CUDA graph, default and Simple/32 channels), and what NCCL says it set up under kiln
# (NCCL_DEBUG=INFO: version, transports, channels) for the BERT layer on 2 GPUs.
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
date; t0=$SECONDS
python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"
ls /usr/local/cuda/lib64/libnccl* /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null; python3 -c "import nvidia.nccl, os; print(os.listdir(os.path.dirname(nvidia.nccl.__file__)+'/lib'))" 2>&1 | tail -1
timeout 120 torchrun --standalone --nproc_per_node 2 $P/nccl_bw.py 2>&1 | grep -v "^W\|^\*\|OMP"
echo "-- NCCL_MIN_NCHANNELS=32"; NCCL_MIN_NCHANNELS=32 timeout 120 torchrun --standalone --nproc_per_node 2 $P/nccl_bw.py 2>&1 | grep "MB:"
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.2"
KILN_LOGS=dist NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING timeout 120 bash tools/kilnrun --nproc 2 --log-dir /tmp/nl $B --json /tmp/j.json > /dev/null 2>&1
grep -v "Channel [0-9]*/[0-9]* :\|Ring [0-9]" /tmp/nl/rank_0.log | grep -i "nccl\|DataParallel\|GPUs" | head -60
grep -c "via P2P" /tmp/nl/rank_0.log; grep "via" /tmp/nl/rank_0.log | head -3
gzip -c /tmp/nl/rank_0.log > $OUT/nccl_rank0.log.gz; echo "at $((SECONDS - t0)) s"; date
