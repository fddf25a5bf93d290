#!/usr/bin/env bash
# session 13, call 1 (1 x H200): sibling reductions in one kernel and recomputed producers
# (fuse::merge_reduce_groups, recompute_producers). The ResNet-18 step with them off
# (KILN_CUDA_MERGE_REDUCTIONS=0 KILN_CUDA_RECOMPUTE=0, "off") and on ("on"), same binary, alternating;
# ncu of one step each; kiln's and torch's training rows; the GPU suites, the CUDA fuzzer, memcheck.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd NCCL_NVLS_ENABLE=0
nvidia-smi -L; date; t0=$SECONDS
flags() { if [ "$1" = off ]; then echo "KILN_CUDA_MERGE_REDUCTIONS=0 KILN_CUDA_RECOMPUTE=0"; else echo "KILN_CUDA_MERGE_REDUCTIONS=1"; fi; }
for b in 16 64; do for v in off on off on; do
  echo "-- $v reduce_overhead $b"; env $(flags $v) KILN_CACHE_DIR=/tmp/kc timeout 60 $P/t/resnet_prof reduce_overhead $b 2>&1 | grep -E "us per|first|kernels|rror" | tail -2
done; done 2>&1 | sed 's/^/  /'
echo "at $((SECONDS - t0)) s"
for v in off on; do
  env $(flags $v) KILN_CACHE_DIR=/tmp/kc timeout 120 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/t/resnet_prof reduce_overhead 16 > $OUT/ncu_$v.csv 2>&1; echo "ncu $v rc=$?"
done
python3 $P/classify.py $OUT/ncu_off.csv $OUT/ncu_on.csv
gzip $OUT/ncu_*.csv
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln train rc=$? at $((SECONDS - t0)) s"
grep -E "_train" $OUT/kiln_train.txt | grep -vE "^  " | grep -E "eager|compiled|reduce_overhead"
timeout 200 python3 bench/anchors/torch_train_anchor.py --min-time 0.3 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch train rc=$? at $((SECONDS - t0)) s"
grep -vE "^\s*$" $OUT/torch_train.txt | tail -9; gzip $OUT/torch_train.txt $OUT/kiln_train.txt
for t in cuda_ops autograd nn compile cuda_semantics; do KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log; done
KILN_CACHE_DIR=/tmp/kct KILN_FUZZ_DEVICE=cuda KILN_FUZZ_GRAPHS=150 timeout 150 $P/t/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/t.log 2>&1; echo "== fuzz rc=$? $(grep -E "test cases:|programs" $OUT/t.log | tr -s " " | head -3) at $((SECONDS - t0)) s"; cat $OUT/t.log >> $OUT/tests.log
KILN_CACHE_DIR=/tmp/kct timeout 120 compute-sanitizer --tool memcheck --report-api-errors no $P/t/kiln_test_cuda_ops -tc="*sibling reductions*" > $OUT/t.log 2>&1; echo "== memcheck rc=$? $(grep -E "ERROR SUMMARY|test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $OUT/tests.log
rm -f $OUT/t.log; gzip $OUT/tests.log
date
