#!/usr/bin/env bash
# issue 16, device call 4: PyTorch's ResNet-18 ONNX file after Conv absorbs Add/Relu (TF32 and f32), node tests on CUDA
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models resnet18 --no-compile 2>&1 | grep '^{' | cut -c1-200
for flag in --tf32 ""; do
  echo "== resnet18 $flag"; timeout 120 $B/examples/example_onnx_import /tmp/tm/resnet18.onnx --input /tmp/tm/resnet18.input.npy --expect /tmp/tm/resnet18.torch.npy --tol 1e-2 --cuda $flag --time 2>&1 | tail -3
done
mkdir -p /tmp/nd && tar xzf .device-build/node.tgz -C /tmp/nd
timeout 200 $B/tests/kiln_onnx_node_tests /tmp/nd/node --cuda --quiet --expect tests/onnx/node_tests_passing.txt 2>&1 | tail -3
date
