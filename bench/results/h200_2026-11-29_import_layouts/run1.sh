#!/usr/bin/env bash
# session 17 call 1: ResNet-18 / BERT layer, traced vs imported ONNX (kiln's own and PyTorch's), with a profile of one call each
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models resnet18,bert_layer_f32 --no-compile 2>&1 | grep '^{' | cut -c1-300
for m in resnet18 bert_layer_f32; do
  echo "== $m"; timeout 200 /tmp/b/t/${PROBE:-import_probe_old} $m /tmp/tm/$m.onnx --profile > $OUT/${PROBE:-import_probe_old}_$m.txt 2>&1; echo rc=$?
  grep -v "^\[kiln:profile\]" $OUT/${PROBE:-import_probe_old}_$m.txt
done
date
