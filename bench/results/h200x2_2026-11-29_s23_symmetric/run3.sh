#!/usr/bin/env bash
# session 23, call 3 (2 x H200): does a rank that dies mid-training still make the other raise
# DistError when the buckets are symmetric windows? The dist worker's die test for the MLP and the
# BERT layer, compiled and reduce_overhead, windows on (default) and off; KILN_LOGS=dist shows where.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
for m in mlp bert; do for mode in compiled reduce_overhead; do for w in 1 0; do
  echo "== $m $mode windows=$w"
  KILN_DDP_WINDOWS=$w KILN_LOGS=dist NCCL_DEBUG=WARN timeout 90 bash tools/kilnrun --nproc 2 --grace 25 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model $m > $OUT/die_${m}_${mode}_$w.txt 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "EXPECTED|failed:|aborted|exiting|kilnrun|symmetric window" $OUT/die_${m}_${mode}_$w.txt | cut -c1-220 | head -8
done; done; done
gzip $OUT/*.txt; date
