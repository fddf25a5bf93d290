#!/usr/bin/env bash
# session 9, call 4: after the max-pool gradient's window walk and the unrolled column loop: suites,
# the training rows (kiln and torch in one call), split-finish on/off, an ncu profile.
export LD_LIBRARY_PATH=$PWD/.device-build/s9/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
B=build/dev; P=.device-build/s9; LOG=$OUT/tests.log
for t in cuda_ops autograd; do timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ")"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -30; done
rm -f $OUT/t.log; echo "tests done at $((SECONDS - t0)) s"
for f in 1 0; do echo "-- KILN_CUDA_SPLIT_FINISH=$f"; KILN_CUDA_SPLIT_FINISH=$f timeout 100 $P/new/resnet_prof reduce_overhead 16 2>&1 | grep -E "us per|kernels|rror"; done
timeout 200 $B/bench/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_new.json > $OUT/bench.txt 2>&1; echo "kiln exit $?"
grep -E "_train|first step" $OUT/bench.txt | grep -v "^#"
echo "kiln done at $((SECONDS - t0)) s"
timeout $((480 - SECONDS)) python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.3 --workloads resnet18_train,bert_layer_train,mlp_train 2>&1 | grep torch_train_anchor
echo "torch done at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout $((585 - SECONDS)) $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/new/resnet_prof compiled 16 > $OUT/ncu_new.csv 2>/dev/null; echo "ncu rc=$?"
python3 $P/classify.py $OUT/ncu_new.csv; python3 $P/summarize.py $OUT/ncu_new.csv 2>/dev/null | head -14
date
