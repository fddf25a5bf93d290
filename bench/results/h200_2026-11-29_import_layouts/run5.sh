#!/usr/bin/env bash
# session 17 call 5: the training rows after constant_layouts / fold_call_epilogue / the matmul copy rule (do they change training?), kiln_bench and torch_train_anchor.py
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
timeout 300 /tmp/b/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln rc=$? at $((SECONDS - t0)) s"
grep -E "_train .*(compiled|reduce_overhead) |rror|FAIL" $OUT/kiln_train.txt
timeout 240 python3 bench/anchors/torch_train_anchor.py --min-time 0.3 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch rc=$? at $((SECONDS - t0)) s"
grep -E "anchor\]" $OUT/torch_train.txt | head -20
date
