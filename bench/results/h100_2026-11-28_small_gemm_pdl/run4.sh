#!/usr/bin/env bash
# session 11, call 4: the final build (PDL only for launches of at most half a device's threads; the
# attention mask's rows found once): suites; bert-base new vs KILN_CUDA_PDL=0 vs old; kiln_bench's
# bert-base bf16 rows and torch's (transformers BertModel) in one call; the training rows new vs old.
cd "$(dirname "$0")" && rm -rf t old && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s11
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops autograd nn; do KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new pdl0 old new pdl0 old; do
  b=$P/bert_prof; e=""; [ $v = old ] && b=$P/bert_prof_old; [ $v = pdl0 ] && e="KILN_CUDA_PDL=0"
  echo "-- $v $s"; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1
done; done
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_bench --no-cpu --filter bert_base_b1_bf16,bert_base_b8x128_bf16,linears_m8 --json $OUT/kiln_bert.json > $OUT/kiln_bert.txt 2>&1; echo "kiln bert rc=$? at $((SECONDS - t0)) s"
grep -E "^bert_base|^linears|^copy|^gemm" $OUT/kiln_bert.txt | grep -v "autotune_\|warmstart"
for w in bert_base_b1_bf16 bert_base_b8x128_bf16; do timeout 100 python3 bench/anchors/torch_anchor.py --filter $w --json $OUT/torch_$w.json > $OUT/torch_$w.txt 2>&1; echo "torch $w rc=$? at $((SECONDS - t0)) s"; grep -E "bert_base" $OUT/torch_$w.txt | grep -E "eager|compile" | head -4; done
for v in new old; do b=$P/t/kiln_bench; [ $v = old ] && b=$P/old/kiln_bench
  KILN_CACHE_DIR=/tmp/kct_$v timeout $((590 - SECONDS)) $b --no-cpu --filter _train --min-time 0.2 --json $OUT/kiln_train_$v.json > $OUT/kiln_train_$v.txt 2>&1; echo "train $v rc=$? at $((SECONDS - t0)) s"
  grep -E "_train" $OUT/kiln_train_$v.txt | grep -E "compiled|reduce_overhead" | head -6
done
date
