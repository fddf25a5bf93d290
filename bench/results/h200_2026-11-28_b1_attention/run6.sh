#!/usr/bin/env bash
# session 15, call 6: the final build (K fragments by ldmatrix too): cuda_ops on the GPU; bert_prof
# new vs old alternating; kiln_bench's bert-base bf16 rows and the BERT layer bf16, then torch's
# (transformers BertModel; nn.TransformerEncoderLayer) on the same weights and inputs, one call.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops; do KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new old new old; do
  b=$P/t/bert_prof; [ $v = old ] && b=$P/t/bert_prof_old
  echo "-- $v $s: $(KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1)"
done; done
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_bench --no-cpu --filter bert_base_b1_bf16,bert_base_b8x128_bf16,bert_layer_bf16 --json $OUT/kiln_bert.json > $OUT/kiln_bert.txt 2>&1; echo "kiln bert rc=$? at $((SECONDS - t0)) s"
grep -E "^bert_|^copy|^gemm" $OUT/kiln_bert.txt | grep -v "autotune_\|warmstart"
for w in bert_base_b1_bf16 bert_base_b8x128_bf16 bert_layer_bf16; do timeout 150 python3 bench/anchors/torch_anchor.py --filter $w --json $OUT/torch_$w.json > $OUT/torch_$w.txt 2>&1; echo "torch $w rc=$? at $((SECONDS - t0)) s"; grep -E "anchor\] bert|ok=" $OUT/torch_$w.txt | head -8; done
date
