#!/usr/bin/env bash
# session 12, call 3 (1 x H200): the final build (column reductions, baked max-pool geometry,
# counters for capturing streams; attention's text through half_conversions/named_function): GPU
# suites (dist with its worker), the CUDA differential fuzzer, memcheck of the column reduction test,
# the ResNet-18 step old/new, and kiln's and torch's training rows.
cd "$(dirname "$0")" && rm -rf t old new && tar xzf bins.tar.gz && ln -s t new && cd - > /dev/null
P=.device-build/s12
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd NCCL_NVLS_ENABLE=0
nvidia-smi -L; date; t0=$SECONDS
for b in 16 64; do for v in old new; do
  echo "-- $v reduce_overhead $b"; KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $P/$v/resnet_prof reduce_overhead $b 2>&1 | grep -E "us per|rror" | tail -1
done; done 2>&1 | sed 's/^/  /'
KILN_CACHE_DIR=/tmp/kc_new timeout 150 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.5 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln train rc=$? at $((SECONDS - t0)) s"
grep -E "_train" $OUT/kiln_train.txt | grep -vE "^  " | grep -E "eager|compiled|reduce_overhead"
timeout 200 python3 bench/anchors/torch_train_anchor.py --min-time 0.5 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch train rc=$? at $((SECONDS - t0)) s"
grep -vE "^\s*$" $OUT/torch_train.txt | tail -9; gzip $OUT/torch_train.txt $OUT/kiln_train.txt
for t in cuda_ops autograd nn compile cuda_semantics dist; do KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log; done
KILN_CACHE_DIR=/tmp/kct KILN_FUZZ_DEVICE=cuda KILN_FUZZ_GRAPHS=300 timeout 150 $P/t/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/t.log 2>&1; echo "== fuzz rc=$? $(grep -E "test cases:|programs" $OUT/t.log | tr -s " " | head -3) at $((SECONDS - t0)) s"; cat $OUT/t.log >> $OUT/tests.log
KILN_CACHE_DIR=/tmp/kct timeout 150 compute-sanitizer --tool memcheck --report-api-errors no $P/t/kiln_test_cuda_ops -tc="*column reductions over channel counts*,*split reductions*" > $OUT/t.log 2>&1; echo "== memcheck rc=$? $(grep -E "ERROR SUMMARY|test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $OUT/tests.log
rm -f $OUT/t.log; gzip $OUT/tests.log
date
