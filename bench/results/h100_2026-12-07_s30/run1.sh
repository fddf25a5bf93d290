#!/usr/bin/env bash
# session 30, call 1: channels-last conv weights. Tests (autograd's CUDA cases, cuda_ops), then the
# training rows old (a03926d) / new alternating, then torch's training anchor, in one call.
cd "$(dirname "$0")" && rm -rf new old && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s30
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc KILN_CUDA_PREFETCH_AHEAD=0
nvidia-smi -L; date; t0=$SECONDS
timeout 120 $P/new/kiln_test_autograd -tc="*CUDA*,*channels-last*,*ResNet*,*reduce_overhead*" > $OUT/test_autograd.log 2>&1
echo "== test_autograd rc=$? $(grep -E "test cases:|assertions:" $OUT/test_autograd.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
grep -E "ERROR|FATAL|kernels per step|resnet18 training" -A3 $OUT/test_autograd.log | head -30
for rep in 1 2; do for v in old new; do
  KILN_CACHE_DIR=/tmp/kc_${v}_$rep timeout 120 $P/$v/kiln_bench --no-cpu --filter resnet18_train --min-time 0.3 --json $OUT/rn_${v}_$rep.json > $OUT/rn_${v}_$rep.txt 2>&1
  echo "-- $v $rep rc=$?: $(grep -E "^resnet18_train +(compiled|reduce_overhead)" $OUT/rn_${v}_$rep.txt | tr -s ' ' | cut -c1-150 | tr '\n' '|')"
  grep -E "first step" $OUT/rn_${v}_$rep.txt | cut -c1-200
done; done
echo "bench at $((SECONDS - t0)) s"
timeout 200 python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.3 --workloads resnet18_train > $OUT/torch_train.txt 2>&1; echo "torch rc=$?"
tail -25 $OUT/torch_train.txt
echo "anchor at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kct timeout 100 $P/new/kiln_test_cuda_ops -tce="*fuzz*" > $OUT/test_cuda_ops.log 2>&1
echo "== test_cuda_ops rc=$? $(grep -E "test cases:|assertions:" $OUT/test_cuda_ops.log | tr -s ' ' | tr '\n' ' ') at $((SECONDS - t0)) s"
grep -E "ERROR|FATAL" -A8 $OUT/test_cuda_ops.log | head -20
date
