#!/usr/bin/env bash
# session 15, call 3: short-sequence attention (a warp per 16 query rows, 16/32-key tiles) and
# small products with more warps for a long k: cuda_ops and nn on the GPU; bert_prof new vs old
# (HEAD 8a042b9) alternating, b1 and b8x128; CUPTI timeline of new b1.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops nn; do KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new old new old new old; do
  b=$P/t/bert_prof; [ $v = old ] && b=$P/t/bert_prof_old
  echo "-- $v $s: $(KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror|kernels" | tail -2 | tr '\n' ' ')"
done; done
echo "at $((SECONDS - t0)) s"
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti || echo "cupti build failed"
mkdir -p /tmp/tr
for s in b1 b8x128; do KILN_CACHE_DIR=/tmp/kc_new CUPTI_TRACE_MATCH=bert_prof CUPTI_TRACE_OUT=/tmp/tr/new_$s LD_PRELOAD=/tmp/libct.so timeout 60 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per" | tail -1; done
python3 tools/cupti_timeline.py --list /tmp/tr /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; grep -A12 "==" $OUT/timeline.txt
tar czf $OUT/tsv.tar.gz -C /tmp/tr $(cd /tmp/tr && ls *.tsv)
echo "at $((SECONDS - t0)) s"; date
