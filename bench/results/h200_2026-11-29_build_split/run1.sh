#!/usr/bin/env bash
# session 18 call 1: the export and ONNX code moved into kiln_compiled / kiln::onnx_compiled, on the GPU:
# test_export, test_nn, example_export_deploy (CUDA rows), example_onnx_import --cuda on torch's files, the node tests
set -o pipefail
P=.device-build/s18
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
for t in export nn; do echo "== test $t"; timeout 400 /tmp/b/t/kiln_test_$t 2>&1 | tail -3; echo "at $((SECONDS - t0)) s"; done
echo "== example_export_deploy"; timeout 300 /tmp/b/t/example_export_deploy /tmp/exp 2>&1 | tail -8
timeout 300 /tmp/b/t/example_export_deploy --run /tmp/exp/mlp.kiln /tmp/exp/mlp.check.safetensors /tmp/exp/resnet18.kiln /tmp/exp/resnet18.check.safetensors 2>&1 | tail -4
echo "== torch ONNX files"; timeout 300 python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models resnet18,bert_layer_f32,mlp_f32 --no-compile 2>&1 | tail -3; ls /tmp/tm
for f in /tmp/tm/*.onnx; do echo "== example_onnx_import $f --cuda"; timeout 200 /tmp/b/t/example_onnx_import $f --cuda 2>&1 | tail -3; done
D=/usr/share/libonnx-testdata/data/node
if [ -d $D ]; then echo "== node tests"; timeout 300 /tmp/b/t/kiln_onnx_node_tests $D --quiet --expect tests/onnx/node_tests_passing.txt 2>&1 | tail -3; else echo "no libonnx-testdata on the device"; fi
echo "done at $((SECONDS - t0)) s"; date
