#!/usr/bin/env bash
# session 13, call 2 (1 x H200): "old" = call 1's code (sibling reductions joined, producers
# recomputed; resnet_prof built from HEAD a4a23e2 + that diff), "new" = + each conv weight copied
# channels-last once per step (cuDNN's forward and backward data share it) + BatchNorm's batch
# statistics in one pass (shifted sums, sibling reductions). ResNet-18 steps old/new alternating, ncu of
# one step each, kiln's and torch's training rows, the GPU suites, memcheck of the BatchNorm tests.
cd "$(dirname "$0")" && rm -rf t old && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd NCCL_NVLS_ENABLE=0
nvidia-smi -L; date; t0=$SECONDS
for b in 16 64; do for v in old t old t; do
  echo "-- $v reduce_overhead $b"; KILN_CACHE_DIR=/tmp/kc timeout 60 $P/$v/resnet_prof reduce_overhead $b 2>&1 | grep -E "us per|kernels|rror" | tail -2
done; done 2>&1 | sed 's/^/  /'
echo "at $((SECONDS - t0)) s"
for v in old t; do
  KILN_CACHE_DIR=/tmp/kc timeout 120 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/$v/resnet_prof reduce_overhead 16 > $OUT/ncu_$v.csv 2>&1; echo "ncu $v rc=$?"
done
python3 $P/classify.py $OUT/ncu_old.csv $OUT/ncu_t.csv
gzip $OUT/ncu_*.csv
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln train rc=$? at $((SECONDS - t0)) s"
grep -E "_train" $OUT/kiln_train.txt | grep -vE "^  " | grep -E "eager|compiled|reduce_overhead"
timeout 200 python3 bench/anchors/torch_train_anchor.py --min-time 0.3 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch train rc=$? at $((SECONDS - t0)) s"
grep -vE "^\s*$" $OUT/torch_train.txt | tail -9; gzip $OUT/torch_train.txt $OUT/kiln_train.txt
for t in cuda_ops autograd nn compile; do KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log; done
KILN_CACHE_DIR=/tmp/kct timeout 150 compute-sanitizer --tool memcheck --report-api-errors no $P/t/kiln_test_autograd -tc="*training layers on CUDA*,*BatchNorm2d in training mode*" > $OUT/t.log 2>&1; echo "== memcheck rc=$? $(grep -E "ERROR SUMMARY|test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $OUT/tests.log
rm -f $OUT/t.log; gzip $OUT/tests.log
date
