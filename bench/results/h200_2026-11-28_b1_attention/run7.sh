#!/usr/bin/env bash
# session 15, call 7: attention with two warps per query-row group (each half of every key tile,
# states merged at the end) where the grid has few row warps: cuda_ops on the GPU (and its
# attention case again with KILN_CUDA_ATTN_KSPLIT=1); bert_prof 8 x 128 and b1, split auto vs 1,
# alternating; kiln_bench's BERT rows with each.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
timeout 200 $P/t/kiln_test_cuda_ops --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== cuda_ops rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40
KILN_CUDA_ATTN_KSPLIT=1 timeout 100 $P/t/kiln_test_cuda_ops -tc="*scaled_dot_product_attention*" --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== attention, KSPLIT=1 rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40
rm -f $OUT/t.log; gzip $LOG
for s in b8x128 b1; do for v in auto 1 auto 1 auto 1; do e=""; [ $v = 1 ] && e="KILN_CUDA_ATTN_KSPLIT=1"
  echo "-- split $v $s: $(env $e timeout 60 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1)"
done; done
echo "at $((SECONDS - t0)) s"
for v in auto 1; do e=""; [ $v = 1 ] && e="KILN_CUDA_ATTN_KSPLIT=1"
  env $e timeout 150 $P/t/kiln_bench --no-cpu --filter bert_base_b8x128_bf16,bert_layer_bf16,bert_layer_train --json $OUT/kiln_$v.json > $OUT/kiln_$v.txt 2>&1; echo "kiln split $v rc=$? at $((SECONDS - t0)) s"
  grep -E "^bert_" $OUT/kiln_$v.txt | grep -E "reduce_overhead|compiled" 
done
date
