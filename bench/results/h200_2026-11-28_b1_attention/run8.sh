#!/usr/bin/env bash
# session 15, call 8: the small product's loads of A issued with W's before the first MMA of a
# round: cuda_ops on the GPU; bert_prof new vs old (HEAD fea951e) alternating, b1 and b8x128.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_test_cuda_ops --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== cuda_ops rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new old new old new old; do
  b=$P/t/bert_prof; [ $v = old ] && b=$P/t/bert_prof_old
  echo "-- $v $s: $(KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1)"
done; done
date
