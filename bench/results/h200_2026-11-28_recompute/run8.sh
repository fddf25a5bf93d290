#!/usr/bin/env bash
# session 13, call 8 (2 x H200): after the fuser stores DataParallel's averaged bucket in place
# (no copy back into the bucket's memory): the BERT layer (32 x 128) and ResNet-18 (64) on 1 GPU
# plain, 1 GPU inside DataParallel (--ddp), 2 GPUs; then kiln_test_dist (with its multi_gpu suite).
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
for w in "bert_layer_train 32" "resnet18_train 64"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.2 --batch $2"
  timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  timeout 100 $P/t/kiln_ddp_bench $B --ddp 2>&1 | grep -E "GPU|rror" | head -2
  timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  echo "at $((SECONDS - t0)) s"
done
KILN_CACHE_DIR=/tmp/kcd timeout 200 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
KILN_CACHE_DIR=/tmp/kct timeout 100 $P/t/kiln_test_autograd --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/ag.log 2>&1; echo "== autograd rc=$? $(grep -E "test cases:" $OUT/ag.log | tr -s " ") at $((SECONDS - t0)) s"
gzip $OUT/*.log; date
