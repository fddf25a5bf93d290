#!/usr/bin/env bash
# session 13, call 9 (2 x H200): the final build (+ ir::Node::fresh): the GPU suites, kiln_test_dist
# with its multi_gpu suite, and the data-parallel steps (kiln only) as call 8.
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
nvidia-smi -L; date; t0=$SECONDS
for w in "bert_layer_train 32" "resnet18_train 64"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.2 --batch $2"
  timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
  echo "at $((SECONDS - t0)) s"
done
KILN_CACHE_DIR=/tmp/kcd timeout 150 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/t.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -20; cat $OUT/t.log >> $OUT/tests.log
for t in cuda_ops autograd nn compile cuda_semantics; do KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log; done
rm -f $OUT/t.log; gzip $OUT/tests.log; date
