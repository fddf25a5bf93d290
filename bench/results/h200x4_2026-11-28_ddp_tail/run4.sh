#!/usr/bin/env bash
# session 14, call 4 (2 x H200): after the high-priority communication stream, the small last
# bucket and no all-reduce for one rank: CUPTI timelines of the BERT layer (32 x 128) on 1 GPU
# (DataParallel) and 2 GPUs; kiln rows on 1 and 2 GPUs (BERT layer, ResNet-18 at 64); bucket sizes
# 25 and 5 MB; kiln_test_dist (every GPU suite).
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
NS=$(nvidia-smi -L | grep -c "^GPU"); NS=$([ "$NS" -ge 4 ] && echo "2 4" || echo 2); date; t0=$SECONDS
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti
mkdir -p /tmp/tr /tmp/ddp
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
KILN_LOGS=dist timeout 60 $B --ddp --json /tmp/j.json 2>&1 | grep -i "bucket\|DataParallel"
CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/b1ddp LD_PRELOAD=/tmp/libct.so timeout 60 $B --ddp --json /tmp/j.json 2>&1 | grep "DataParallel:"
for n in $NS; do CUPTI_TRACE_MATCH=kiln_ddp_bench CUPTI_TRACE_OUT=/tmp/tr/b$n LD_PRELOAD=/tmp/libct.so timeout 60 bash tools/kilnrun --nproc $n $B --json /tmp/j.json 2>&1 | grep "DataParallel:"; done
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > /tmp/tr/timeline.txt 2>&1; grep -v "^     *[0-9.]* *[0-9]*  [a-z_]" /tmp/tr/timeline.txt | head -40
tar czf $OUT/traces.tar.gz -C /tmp/tr list timeline.txt
echo "traces at $((SECONDS - t0)) s"
for w in "bert_layer_train 32 _b32" "resnet18_train 64 _r64"; do set -- $w
  MIN_TIME=0.2 TORCH_METHODS=none KILN_METHODS=reduce_overhead WORKLOADS=$1 BATCH=$2 TAG=$3 bash bench/ddp_compare.sh $P/bd /tmp/ddp $NS > /tmp/ddp/log$3.txt 2>&1; echo "$1 rc=$? at $((SECONDS - t0)) s"
  grep -v "^\s*$" /tmp/ddp/report$3.md | head -12
done
for n in $NS; do for mb in 5; do
  timeout 120 bash tools/kilnrun --nproc $n $P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.2 --bucket-mb $mb --json /tmp/j.json 2>&1 | grep "GPUs DataParallel" | sed "s/^/bucket $mb MB: /"
done; done
tar czf $OUT/ddp.tar.gz -C /tmp ddp
timeout 240 $P/t/kiln_test_dist --test-suite-exclude=download --no-skip > /tmp/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" /tmp/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 /tmp/dist.log | head -30
gzip -c /tmp/dist.log > $OUT/dist.log.gz; date
