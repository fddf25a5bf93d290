#!/usr/bin/env bash
# session 22, call 1 (data for issues 17 and 15): where bert-base bf16's forward goes at 8 x 128
# and at batch 1 (reduce_overhead: CUPTI timeline of one graph replay; ncu of one forward's kernels
# at 8 x 128), and where the compiled ResNet-18 training step goes (CUPTI timeline of its
# reduce_overhead replays in kiln_bench).
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp -o /tmp/libct.so -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcupti || echo "cupti build failed"
mkdir -p /tmp/tr
for s in b8x128 b1; do
  timeout 120 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per|first call|rror|kernels" | tee -a $OUT/bert_prof.txt
  CUPTI_TRACE_MATCH=bert_prof CUPTI_TRACE_OUT=/tmp/tr/bert_$s LD_PRELOAD=/tmp/libct.so timeout 120 $P/t/bert_prof reduce_overhead bf16 $s 2>&1 | grep -E "us per" | tail -1
done
echo "bert at $((SECONDS - t0)) s"
CUPTI_TRACE_MATCH=kiln_bench CUPTI_TRACE_OUT=/tmp/tr/resnet LD_PRELOAD=/tmp/libct.so timeout 240 $P/t/kiln_bench --no-cpu --filter resnet18_train > $OUT/kiln_resnet.txt 2>&1; echo "resnet rc=$? at $((SECONDS - t0)) s"
grep -E "resnet18_train" $OUT/kiln_resnet.txt | head -20
python3 tools/cupti_timeline.py --list /tmp/tr /tmp/tr/*.csv > $OUT/timeline.txt 2>&1; tail -40 $OUT/timeline.txt
tar czf $OUT/tsv.tar.gz -C /tmp/tr $(cd /tmp/tr && ls *.tsv)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 150 $NCU --profile-from-start off --cache-control none --clock-control none --section SpeedOfLight --section LaunchStats $P/t/bert_prof reduce_overhead bf16 b8x128 > $OUT/ncu_b8.txt 2>&1; echo "ncu rc=$? at $((SECONDS - t0)) s"
grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu_b8.txt | head -60 > $OUT/ncu_b8_summary.txt; head -60 $OUT/ncu_b8_summary.txt
gzip $OUT/ncu_b8.txt; date
