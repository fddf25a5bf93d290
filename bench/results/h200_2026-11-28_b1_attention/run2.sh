#!/usr/bin/env bash
# session 15, call 2: ncu of one bert-base bf16 batch-1 forward (reduce_overhead, the graph's
# kernels one at a time, caches not flushed, clocks not locked): the first layer's kernels'
# durations and warp stalls (why attention takes 6.5 us of the chain at 8 tokens).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s15
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 200 $NCU --profile-from-start off --cache-control none --clock-control none --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis $P/t/bert_prof reduce_overhead bf16 b1 > $OUT/ncu_b1.txt 2>&1; echo "ncu rc=$? at $((SECONDS - t0)) s"
grep -E "^  kiln_|^  [a-z_]+.*\(|Duration" $OUT/ncu_b1.txt | paste - - | awk '{print $1, $(NF-1), $NF}' | head -100 > $OUT/durations.txt; head -20 $OUT/durations.txt
gzip $OUT/ncu_b1.txt; date
