#!/usr/bin/env bash
# issue 16, device call 3: PyTorch's ResNet-18 ONNX file with the channels-last elementwise rule (TF32 and not), the three models' times
set -o pipefail
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc KILN_BENCH_DATA=/tmp/kbd
nvidia-smi -L; date
B=build/dev
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --no-compile 2>&1 | grep '^{' | cut -c1-150
for m in mlp_f32 bert_layer_f32 resnet18; do
  echo "== kiln imports $m (CUDA)"; timeout 120 $B/examples/example_onnx_import /tmp/tm/$m.onnx --input /tmp/tm/$m.input.npy --expect /tmp/tm/$m.torch.npy --tol 1e-3 --cuda --time 2>&1 | tail -2
done
echo "== resnet18 TF32"; timeout 120 $B/examples/example_onnx_import /tmp/tm/resnet18.onnx --input /tmp/tm/resnet18.input.npy --expect /tmp/tm/resnet18.torch.npy --tol 1e-2 --cuda --tf32 --time 2>&1 | tail -2
echo "== kiln_bench resnet18 (compiled, loaded, onnx_import)"; timeout 200 $B/bench/kiln_bench --no-cpu --filter resnet18 --json $OUT/kiln_resnet.json 2>&1 | grep -E "^resnet18 .*(compiled|onnx_import|loaded)|rror" | head
echo "== kiln's own resnet18 ONNX file, imported (TF32)"; timeout 120 $B/examples/example_onnx_import /tmp/kbd/resnet18.onnx --input /tmp/kbd/resnet18.input.npy --expect /tmp/kbd/resnet18.output.npy --tol 1e-2 --cuda --tf32 --time 2>&1 | tail -2
date
