#!/usr/bin/env bash
# session 14, call 1 (4 x H200): how the GPUs are linked; CUPTI timelines of the BERT layer's
# training step (32 x 128 per GPU, reduce_overhead) on 1 GPU plain, 1 GPU DataParallel, 2 and 4
# GPUs; kiln's data-parallel rows on 1, 2 and 4 GPUs (no torch); kiln_test_dist's multi_gpu suite
# (2- and 4-GPU cases).
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s14
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 KILN_CACHE_DIR=/tmp/kcd
nvidia-smi -L; nvidia-smi topo -m; date; t0=$SECONDS
CL=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so /usr/local/cuda/lib64/libcupti.so /usr/local/cuda/targets/x86_64-linux/lib/libcupti.so 2>/dev/null | head -1)
echo "libcupti: $CL"
g++ -O2 -shared -fPIC -I/usr/local/cuda/include -I/usr/local/cuda/extras/CUPTI/include tools/cupti_trace.cpp -o /tmp/libct.so -L$(dirname $CL) -Wl,-rpath,$(dirname $CL) -lcupti || echo "cupti_trace build failed"
mkdir -p $OUT/tr /tmp/tr /tmp/ddp; export CUPTI_TRACE_MATCH=kiln_ddp_bench
B="$P/t/kiln_ddp_bench --workloads bert_layer_train --methods reduce_overhead --batch 32 --min-time 0.1"
CUPTI_TRACE_OUT=/tmp/tr/b1plain LD_PRELOAD=/tmp/libct.so timeout 120 $B --json /tmp/tr/b1plain.json 2>&1 | grep -v "^$" | tail -3
CUPTI_TRACE_OUT=/tmp/tr/b1ddp LD_PRELOAD=/tmp/libct.so timeout 120 $B --ddp --json /tmp/tr/b1ddp.json 2>&1 | tail -3
CUPTI_TRACE_OUT=/tmp/tr/b2 LD_PRELOAD=/tmp/libct.so timeout 120 bash tools/kilnrun --nproc 2 $B --json /tmp/tr/b2.json 2>&1 | tail -3
CUPTI_TRACE_OUT=/tmp/tr/b4 LD_PRELOAD=/tmp/libct.so timeout 120 bash tools/kilnrun --nproc 4 $B --json /tmp/tr/b4.json 2>&1 | tail -3
echo "traces at $((SECONDS - t0)) s"
python3 tools/cupti_timeline.py --list /tmp/tr/list /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; head -c 6000 $OUT/timeline.txt
tar czf $OUT/traces.tar.gz -C /tmp/tr list $(cd /tmp/tr && ls b2.*.csv | head -1)
for w in "bert_layer_train 32 _b32" "resnet18_train 64 _r64" "mlp_train 0 _mlp"; do set -- $w
  MIN_TIME=0.2 TORCH_METHODS=none KILN_METHODS=reduce_overhead WORKLOADS=$1 BATCH=$2 TAG=$3 bash bench/ddp_compare.sh $P/bd /tmp/ddp 2 4 > /tmp/ddp/log$3.txt 2>&1; echo "$1 rc=$? at $((SECONDS - t0)) s"
  grep -v "^\s*$" /tmp/ddp/report$3.md | head -12
done
tar czf $OUT/ddp.tar.gz -C /tmp ddp
timeout 240 $P/t/kiln_test_dist --test-suite=multi_gpu --no-skip > /tmp/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" /tmp/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 /tmp/dist.log | head -30
gzip -c /tmp/dist.log > $OUT/dist.log.gz; date
