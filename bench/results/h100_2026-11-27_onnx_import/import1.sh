#!/usr/bin/env bash
# session of 2026-11-27 (issue 16, ONNX import), device call 1: the ONNX node tests on CUDA, PyTorch's
# exported models (torch.onnx.export dynamo=True) imported by kiln and compared with PyTorch, and
# kiln_bench's model rows (compiled vs the same program through ONNX export + import)
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date
B=build/dev
mkdir -p /tmp/nd && tar xzf .device-build/node.tgz -C /tmp/nd
echo "== node tests, CUDA"; timeout 240 $B/tests/kiln_onnx_node_tests /tmp/nd/node --cuda --quiet --expect tests/onnx/node_tests_passing.txt > $OUT/node_cuda.log 2>&1; echo "rc=$?"; tail -4 $OUT/node_cuda.log; grep -E "^FAIL|REGRESSION" $OUT/node_cuda.log | head -30
date
echo "== torch.onnx.export(dynamo=True) models"; timeout 300 python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda 2>&1 | grep -v Warning | tail -8; cp /tmp/tm/torch.json $OUT/ 2>/dev/null
date
for m in mlp_f32 bert_layer_f32 resnet18; do
  echo "== kiln imports $m (CUDA)"; timeout 120 $B/examples/example_onnx_import /tmp/tm/$m.onnx --input /tmp/tm/$m.input.npy --expect /tmp/tm/$m.torch.npy --tol 1e-3 --cuda --time 2>&1 | tail -6
done
date
echo "== kiln_bench model rows"; timeout 300 $B/bench/kiln_bench --no-cpu --filter mlp_f32,bert_layer_f32,resnet18 --json $OUT/kiln.json 2>&1 | grep -E "compiled|onnx_import|loaded|rror|FAIL" | head -30
date
