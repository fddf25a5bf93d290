#!/usr/bin/env bash
# session 10, call 3: the build with combos held only for sink groups and bias-gradient writes stored
# by their reduction: GPU suites; ResNet-18 old / new / new KILN_CUDA_COMBO=0 (reduce_overhead and
# compiled, fresh kernel caches); the training rows old, new and torch in one call; ncu of new.
cd "$(dirname "$0")" && rm -rf new old t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s10
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops autograd nn compile cuda_semantics export; do KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -30; done
rm -f $OUT/t.log; gzip $LOG
for m in reduce_overhead compiled; do for v in old new combo0; do
  b=$v; e=""; [ $v = combo0 ] && { b=new; e="KILN_CUDA_COMBO=0"; }
  echo "-- $v $m 16"; rm -rf /tmp/kc_$v; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $P/$b/resnet_prof $m 16 2>&1 | grep -E "us per|first|kernels|rror"
done; done
echo "prof done at $((SECONDS - t0)) s"
export KILN_CACHE_DIR=/tmp/kc
timeout 100 $P/old/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_old.json > $OUT/bench.txt 2>&1; echo "old exit $?"
timeout 100 $P/new/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_new.json >> $OUT/bench.txt 2>&1; echo "new exit $?"
grep -E "_train|first step" $OUT/bench.txt | grep -v "^#"
echo "kiln done at $((SECONDS - t0)) s"
timeout $((500 - SECONDS)) python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.3 --workloads resnet18_train,bert_layer_train,mlp_train 2>&1 | grep torch_train_anchor
echo "torch done at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout $((585 - SECONDS)) $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/new/resnet_prof compiled 16 > $OUT/ncu_new.csv 2>/dev/null; echo "ncu rc=$?"
python3 $P/classify.py $OUT/ncu_new.csv; python3 $P/summarize.py $OUT/ncu_new.csv 2>/dev/null | head -14
gzip $OUT/ncu_new.csv
date
