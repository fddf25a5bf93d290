#!/usr/bin/env bash
# session 17 call 2: constant_layouts + fold_call_epilogue: imported ResNet-18 / BERT layer against traced (new and old binaries alternating), GPU tests
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models resnet18,bert_layer_f32 --no-compile 2>&1 | grep '^{' | cut -c1-120
for round in 1 2; do
  for probe in import_probe import_probe_old; do
    for m in resnet18 bert_layer_f32; do
      echo "== round $round $probe $m"; timeout 200 /tmp/b/t/$probe $m /tmp/tm/$m.onnx $([ $round = 1 ] && echo --profile) > $OUT/${probe}_${m}_r$round.txt 2>&1; echo rc=$?
      grep -v "^\[kiln:profile\]" $OUT/${probe}_${m}_r$round.txt
    done
  done
done
echo "== bert, KILN_FUSED_ATTENTION=0"; KILN_FUSED_ATTENTION=0 timeout 200 /tmp/b/t/import_probe bert_layer_f32 /tmp/tm/bert_layer_f32.onnx 2>&1 | grep -v "^\[kiln"
for t in ${TESTS:-}; do
  echo "== test $t"; timeout 300 /tmp/b/t/kiln_test_$t 2>&1 | tail -3
done
if [ -x /tmp/b/t/kiln_bench ]; then
  echo "== kiln_bench resnet18"; timeout 200 /tmp/b/t/kiln_bench --no-cpu --filter resnet18 --min-time 0.3 2>&1 | grep -E "^resnet18 |rror|FAIL" | head -20
fi
date
