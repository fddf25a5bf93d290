#!/usr/bin/env bash
# session 30, call 2: resnet18_train old (a03926d) / new (channels-last conv weights) alternating,
# each from an empty kernel cache, then torch's training anchor (resnet18_train), in one call
cd "$(dirname "$0")" && rm -rf new old && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s30
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CUDA_PREFETCH_AHEAD=0
nvidia-smi -L; date; t0=$SECONDS
for rep in 1 2; do for v in old new; do
  KILN_CACHE_DIR=/tmp/kc_${v}_$rep timeout 60 $P/$v/kiln_bench --no-cpu --filter resnet18_train --min-time 0.3 --json $OUT/rn_${v}_$rep.json > $OUT/rn_${v}_$rep.txt 2>&1
  echo "-- $v $rep rc=$?: $(grep -E "^resnet18_train +(compiled|reduce_overhead)" $OUT/rn_${v}_$rep.txt | tr -s ' ' | cut -c1-150 | tr '\n' '|')"
  grep -E "first step" $OUT/rn_${v}_$rep.txt | cut -c1-200
done; done
echo "bench at $((SECONDS - t0)) s"
timeout 110 python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.3 --workloads resnet18_train > $OUT/torch_train.txt 2>&1; echo "torch rc=$?"
grep torch_train_anchor $OUT/torch_train.txt | tail -4
date
