#!/usr/bin/env bash
# session 17 call 3: a matmul whose batch dims do not merge into its rows (PyTorch's seq-first BERT layer) copied into one GEMM; new and previous binaries alternating; CUDA GEMM tests
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models bert_layer_f32,mlp_f32 --no-compile 2>&1 | grep '^{' | cut -c1-120
for round in 1 2; do
  for probe in import_probe import_probe_prev; do
    echo "== round $round $probe bert_layer_f32"; timeout 200 /tmp/b/t/$probe bert_layer_f32 /tmp/tm/bert_layer_f32.onnx $([ $round = 1 ] && [ $probe = import_probe ] && echo --profile) > $OUT/${probe}_bert_r$round.txt 2>&1; echo rc=$?
    grep -v "^\[kiln:profile\]" $OUT/${probe}_bert_r$round.txt
  done
done
for t in ${TESTS:-}; do
  echo "== test $t"; timeout 300 /tmp/b/t/kiln_test_$t 2>&1 | tail -3
done
date
