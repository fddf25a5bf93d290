#!/usr/bin/env bash
# session 15, call 1: the small products' L2 look-ahead (batch-1 BERT): cuda_ops on the GPU;
# bert_prof b1 / b8x128 with the look-ahead on (default) and off (KILN_CUDA_L2_AHEAD_MB=0)
# alternating; a budget sweep; CUPTI timelines of b1 both ways.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops; do timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in on off on off on off; do
  e=""; [ $v = off ] && e="KILN_CUDA_L2_AHEAD_MB=0"
  echo "-- $v $s: $(env $e timeout 60 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror|kernels" | tail -2 | tr '\n' ' ')"
done; done
for mb in 4 8 24 40; do echo "-- ahead ${mb} MB b1: $(KILN_CUDA_L2_AHEAD_MB=$mb timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per" | tail -1)"; done
echo "at $((SECONDS - t0)) s"
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti || echo "cupti build failed"
mkdir -p /tmp/tr
for v in on off; do e=""; [ $v = off ] && e="KILN_CUDA_L2_AHEAD_MB=0"
  env $e CUPTI_TRACE_MATCH=bert_prof CUPTI_TRACE_OUT=/tmp/tr/$v LD_PRELOAD=/tmp/libct.so timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per" | tail -1
done
python3 tools/cupti_timeline.py --list /tmp/tr /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; tail -20 $OUT/timeline.txt
tar czf $OUT/tsv.tar.gz -C /tmp/tr $(cd /tmp/tr && ls *.tsv)
echo "at $((SECONDS - t0)) s"; date
