#!/usr/bin/env bash
# session 11, call 3: PDL (kernels begin with griddepcontrol.wait, launched with programmatic stream
# serialization; the small GEMM prefetches its weights to L2 before the wait): GPU suites; bert-base
# new vs KILN_CUDA_PDL=0 vs old (HEAD cd328c5); per-kernel times without cache flushes; the attention
# kernel's ncu sections; the few-row product rows (graphs), kiln and torch.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s11
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
LOG=$OUT/tests.log
for t in cuda_ops cuda_blas nn compile autograd cuda_semantics export; do KILN_CACHE_DIR=/tmp/kc timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; cat $OUT/t.log >> $LOG; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; done
KILN_CUDA_PDL=0 KILN_CACHE_DIR=/tmp/kc0 timeout 150 $P/t/kiln_test_cuda_ops --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== cuda_ops PDL=0 rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ")"
rm -f $OUT/t.log; gzip $LOG
for s in b1 b8x128; do for v in new pdl0 old new pdl0 old; do
  b=$P/bert_prof; e=""; [ $v = old ] && b=$P/bert_prof_old; [ $v = pdl0 ] && e="KILN_CUDA_PDL=0"
  echo "-- $v $s"; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $b reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1
done; done
echo "at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for s in b1 b8x128; do
  KILN_CACHE_DIR=/tmp/kc_new timeout 100 $NCU --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/bert_prof compiled bf16 $s > $OUT/ncu_nf_$s.csv 2>/dev/null; echo "ncu (no flush) rc=$?"
  python3 $P/summarize.py $OUT/ncu_nf_$s.csv 2>&1 | head -12; gzip $OUT/ncu_nf_$s.csv
done
KILN_CACHE_DIR=/tmp/kc_new timeout 120 $NCU --clock-control none --profile-from-start off -k regex:attention -c 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis $P/bert_prof compiled bf16 b8x128 > $OUT/ncu_attn.txt 2>&1; echo "ncu attn rc=$?"
grep -E "Duration|Throughput|Stall|Warp Cycles Per|Achieved Occupancy|Registers|Block Limit|Theoretical Occ|L1/TEX Hit|L2 Hit|Mem Busy|Issue Slot|Eligible|One or More" $OUT/ncu_attn.txt | head -40
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc timeout 120 $P/t/kiln_bench --no-cpu --filter linears_ --json $OUT/kiln_linears.json > $OUT/kiln_linears.txt 2>&1; echo "kiln bench rc=$?"
grep -E "^linears|^copy" $OUT/kiln_linears.txt
timeout 150 python3 bench/anchors/torch_anchor.py --filter linears_ --json $OUT/torch_linears.json > $OUT/torch_linears.txt 2>&1; echo "torch rc=$?"
grep -E "linears.*compile_ro|linears.*eager" $OUT/torch_linears.txt | head -12
date
