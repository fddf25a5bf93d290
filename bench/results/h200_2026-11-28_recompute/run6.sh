#!/usr/bin/env bash
# session 13, call 6 (1 x H200): the BERT layer's step on one process plain and inside DataParallel
# (--ddp, no communication): kernels per step and the combo launches (KILN_LOGS=combo).
cd "$(dirname "$0")" && rm -rf t old bd && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s13
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.2 --batch 32"
for d in "" --ddp; do echo "== $d"; KILN_LOGS=combo,dist timeout 100 $P/t/kiln_ddp_bench $B $d > $OUT/log$d.txt 2>&1; grep -vE "^\[kiln:combo\]" $OUT/log$d.txt | head -20; grep -c "^\[kiln:combo\]" $OUT/log$d.txt; grep "^\[kiln:combo\]" $OUT/log$d.txt | sort | uniq -c | sort -rn | head -12; done
gzip $OUT/*.txt
