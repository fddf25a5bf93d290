#!/usr/bin/env bash
# session 10, call 2: call 1's GPU suites and ResNet-18 A/B again on the build with the combo
# kernel's binary search, then the training rows: kiln old (HEAD 0cf2f49) and new, and torch.
bash "$(dirname "$0")/run1.sh"
P=.device-build/s10
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
t0=$SECONDS
timeout 120 $P/old/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_old.json > $OUT/bench.txt 2>&1; echo "old exit $?"
timeout 120 $P/new/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_new.json >> $OUT/bench.txt 2>&1; echo "new exit $?"
grep -E "_train|first step" $OUT/bench.txt | grep -v "^#"
echo "kiln done at $((SECONDS - t0)) s"
timeout 150 python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.3 --workloads resnet18_train,bert_layer_train,mlp_train 2>&1 | grep torch_train_anchor
date
