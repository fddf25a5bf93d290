#!/usr/bin/env bash
# session 14, call 2 (4 x H200): bucket sizes (25, 10, 5, 2.5 MB) on 2 and 4 GPUs for the BERT layer
# (32 x 128) and ResNet-18 (64), kiln reduce_overhead, throughput; NCCL protocol and channel
# variants on the BERT layer; CUPTI timelines of the BERT layer at 5 MB on 2 and 4 GPUs.
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
NS=$(nvidia-smi -L | grep -c "^GPU"); NS=$([ "$NS" -ge 4 ] && echo "2 4" || echo 2); date; t0=$SECONDS
for w in "bert_layer_train 32" "resnet18_train 64"; do set -- $w
  for n in $NS; do for mb in 25 10 5 2.5; do
    timeout 120 bash tools/kilnrun --nproc $n $P/t/kiln_ddp_bench --workloads $1 --methods reduce_overhead --batch $2 --min-time 0.2 --bucket-mb $mb --json /tmp/j.json 2>&1 | grep "GPUs DataParallel" | sed "s/^/bucket $mb MB: /"
  done; done
done
echo "sizes at $((SECONDS - t0)) s"
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.2"
for e in "NCCL_PROTO=Simple" "NCCL_PROTO=LL128" "NCCL_MIN_NCHANNELS=32" "NCCL_MAX_NCHANNELS=8" "NCCL_ALGO=Tree"; do for mb in 25 5; do
  env $e timeout 120 bash tools/kilnrun --nproc 2 $B --bucket-mb $mb --json /tmp/j.json 2>&1 | grep "GPUs DataParallel" | sed "s/^/$e bucket $mb MB: /"
done; done
echo "nccl variants at $((SECONDS - t0)) s"
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr; export CUPTI_TRACE_MATCH=kiln_ddp_bench
for n in $NS; do for mb in 5 2.5; do
  CUPTI_TRACE_OUT=/tmp/tr/b${n}_${mb} LD_PRELOAD=/tmp/libct.so timeout 120 bash tools/kilnrun --nproc $n $B --min-time 0.1 --bucket-mb $mb --json /tmp/j.json 2>&1 | grep "GPUs DataParallel"
  python3 tools/cupti_timeline.py --list /tmp/tr/list $(ls /tmp/tr/b${n}_${mb}.*.csv | head -1) | head -12
done; done
tar czf $OUT/traces.tar.gz -C /tmp/tr list; date
