#!/usr/bin/env bash
# session 8: the BERT rows, kiln (one-kernel attention on) and PyTorch + transformers, one call
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date
F=bert_base,bert_layer_f32,bert_layer_bf16
timeout 250 build/dev/bench/kiln_bench --no-cpu --filter $F --json $OUT/kiln.json > $OUT/kiln.txt 2>&1; echo "== kiln rc=$?"
timeout 320 python3 bench/anchors/torch_anchor.py --filter bert_base --json $OUT/torch.json > $OUT/torch.txt 2>&1; echo "== torch rc=$?"
grep -E "^bert_base" $OUT/kiln.txt | grep -E " (compiled|reduce_overhead) "
grep -E "bert_base" $OUT/torch.txt | head -20
date
