#!/usr/bin/env bash
# session 15, call 5: the attention kernel's key terms in shared memory, scores in log2 units (ex2), packed stores:
# cuda_ops on the GPU; bert_prof new vs old (HEAD 8a042b9) alternating, b1 and b8x128; ncu of the attention at 8 x 128.
#
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops; do KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu,multi_gpu4 --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new old new old new old; do
  b=$P/t/bert_prof; [ $v = old ] && b=$P/t/bert_prof_old
  echo "-- $v $s: $(KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror|kernels" | tail -2 | tr '\n' ' ')"
done; done
echo "at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
KILN_CACHE_DIR=/tmp/kc_new timeout 200 $NCU --profile-from-start off --cache-control none --clock-control none -k regex:attention --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters --section InstructionStats $P/t/bert_prof reduce_overhead bf16 b8x128 > $OUT/ncu_attn.txt 2>&1; echo "ncu rc=$? at $((SECONDS - t0)) s"
grep -E "^  kiln|Duration|Registers|Achieved Occ|Warp Cycles Per Issued|Executed Instructions  " $OUT/ncu_attn.txt | head; date
