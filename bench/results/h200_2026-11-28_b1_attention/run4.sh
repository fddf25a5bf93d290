#!/usr/bin/env bash
# session 15, call 4: the attention kernel at 8 x 128 (11 us a layer against cuDNN's ~5): query
# warps per block 1 / 2 / 4 (KILN_CUDA_ATTN_QWARPS) on bert_prof b8x128 and b1; ncu of one
# attention launch at 8 x 128 (warp stalls, source counters).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
for s in b8x128 b1; do for w in 0 1 2 4 0 1 2 4; do
  echo "-- qwarps $w $s: $(KILN_CUDA_ATTN_QWARPS=$w timeout 60 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per|rror" | tail -1)"
done; done
echo "at $((SECONDS - t0)) s"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 200 $NCU --profile-from-start off --cache-control none --clock-control none -k regex:attention --launch-count 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters --section InstructionStats $P/t/bert_prof reduce_overhead bf16 b8x128 > $OUT/ncu_attn.txt 2>&1; echo "ncu rc=$? at $((SECONDS - t0)) s"
grep -E "Duration|Registers|Achieved Occ|Warp Cycles Per Issued|Executed Instructions  " $OUT/ncu_attn.txt | head; date
