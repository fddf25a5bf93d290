#!/usr/bin/env bash
# session 13, call 7 (1 x H200): the BERT layer's compiled step on one process, plain and inside
# DataParallel (--ddp), with KILN_LOGS=profile (every group of the step with its kind, shape and time).
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
B="--workloads bert_layer_train --methods compiled --min-time 0.05 --batch 32"
for d in "" --ddp; do echo "== $d"; KILN_LOGS=profile timeout 100 $P/t/kiln_ddp_bench $B $d > $OUT/prof$d.txt 2>&1; grep -c "kiln:profile" $OUT/prof$d.txt; done
gzip $OUT/*.txt
