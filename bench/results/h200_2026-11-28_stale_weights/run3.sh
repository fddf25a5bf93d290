#!/usr/bin/env bash
# session 16, call 3: the tracer fix (work on a detached parameter recorded): eager against compiled
# per step; autograd's GPU cases; kiln_bench's training rows and torch's in one call (peak memory
# as blocks and as requested bytes on both sides)
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s16
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
for w in resnet18_train bert_layer_train mlp_train; do KILN_CACHE_DIR=/tmp/kc $P/t/stale_probe $w 6 2>&1 | tail -7; done
KILN_CACHE_DIR=/tmp/kc timeout 300 $P/t/kiln_test_autograd --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/autograd.log 2>&1; echo "autograd rc=$? $(grep -E "test cases:" $OUT/autograd.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/autograd.log | head -40
for w in mlp_train bert_layer_train resnet18_train; do KILN_CACHE_DIR=/tmp/kc $P/t/mem_probe $w cuda 2>&1 | tail -2; done
KILN_CACHE_DIR=/tmp/kc timeout 300 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln_bench rc=$? at $((SECONDS - t0)) s"
grep -E "^(mlp|bert|resnet)|peak|first step" $OUT/kiln_train.txt | head -40
timeout 400 python3 bench/anchors/torch_train_anchor.py --min-time 0.3 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch rc=$? at $((SECONDS - t0)) s"
grep -E "anchor\]" $OUT/torch_train.txt | head -20
date
