#!/usr/bin/env bash
# session 16, call 7: resnet18_train, kiln_bench and torch_train_anchor.py alternating twice in one
# call (the final build): is kiln's step ahead of torch.compile reduce-overhead or level with it?
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s16
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
for r in 1 2; do
  KILN_CACHE_DIR=/tmp/kcb timeout 200 $P/t/kiln_bench --no-cpu --filter resnet18_train --min-time 0.5 --json $OUT/kiln_r$r.json > $OUT/kiln_r$r.txt 2>&1; echo "kiln $r rc=$? at $((SECONDS - t0)) s"
  grep -E "^resnet18_train .*reduce_overhead|reduce_overhead: first" $OUT/kiln_r$r.txt
  timeout 200 python3 bench/anchors/torch_train_anchor.py --workloads resnet18_train --min-time 0.5 --json $OUT/torch_r$r.json > $OUT/torch_r$r.txt 2>&1; echo "torch $r rc=$? at $((SECONDS - t0)) s"
  grep -E "anchor\] resnet18_train" $OUT/torch_r$r.txt
done
date
