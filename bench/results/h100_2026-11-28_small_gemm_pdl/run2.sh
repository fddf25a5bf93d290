#!/usr/bin/env bash
# session 11, call 2: the small-GEMM kernel, the attention kernel's cp.async/ldmatrix rewrite and the
# exact gelu epilogue: GPU suites; bert-base forward old (HEAD cd328c5) vs new vs new without the
# small kernel; ncu per kernel of new; the few-row product rows, kiln and torch.
cd "$(dirname "$0")" && rm -rf t new && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s11
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops cuda_blas nn compile autograd cuda_semantics; do KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -40; done
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in old new small0 new old; do
  b=$P/bert_prof; e=""; [ $v = old ] && b=$P/bert_prof_old; [ $v = small0 ] && e="KILN_CUDA_SMALL_GEMM_M=0"
  echo "-- $v $s"; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -2
done; done
for rl in 32 8; do echo "-- new b8x128 KILN_CUDA_ROW_LANES=$rl"; KILN_CUDA_ROW_LANES=$rl KILN_CACHE_DIR=/tmp/kc_new timeout 60 $P/bert_prof reduce_overhead bf16 b8x128 2>&1 | grep -E "us per|rror" | tail -1; done
echo "-- PDL probe"; timeout 60 $P/pdl_probe
echo "at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for s in b1 b8x128; do
  KILN_CACHE_DIR=/tmp/kc_new timeout 100 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/bert_prof compiled bf16 $s > $OUT/ncu_$s.csv 2>/dev/null; echo "ncu rc=$?"
  python3 $P/summarize.py $OUT/ncu_$s.csv 2>&1 | head -16; gzip $OUT/ncu_$s.csv
done
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 100 $P/t/kiln_bench --no-cpu --filter linears_ --json $OUT/kiln_linears.json > $OUT/kiln_linears.txt 2>&1; echo "kiln bench rc=$?"
grep -E "^linears|^copy" $OUT/kiln_linears.txt
timeout 150 python3 bench/anchors/torch_anchor.py --filter linears_ --json $OUT/torch_linears.json > $OUT/torch_linears.txt 2>&1; echo "torch rc=$?"
grep -E "linears" $OUT/torch_linears.txt | head -20
date
