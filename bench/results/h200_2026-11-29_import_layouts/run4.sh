#!/usr/bin/env bash
# session 17 call 4: the new CUDA GEMM test; PyTorch's MLP and BERT-layer files through example_onnx_import (f32, no TF32) beside kiln_bench's traced rows
set -o pipefail
P=.device-build/s17
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
mkdir -p /tmp/b && tar xzf $P/bins.tar.gz -C /tmp/b
python3 bench/anchors/torch_onnx_models.py /tmp/tm --device cuda --models mlp_f32,bert_layer_f32 --no-compile 2>&1 | grep '^{' | cut -c1-120
for t in ${TESTS:-}; do echo "== test $t"; timeout 300 /tmp/b/t/kiln_test_$t 2>&1 | tail -3; done
for m in mlp_f32 bert_layer_f32; do
  echo "== $m: PyTorch's file"; timeout 120 /tmp/b/t/example_onnx_import /tmp/tm/$m.onnx --input /tmp/tm/$m.input.npy --expect /tmp/tm/$m.torch.npy --tol 1e-3 --cuda --time 2>&1 | tail -3
done
echo "== kiln_bench traced rows"; timeout 300 /tmp/b/t/kiln_bench --no-cpu --filter mlp_f32,bert_layer_f32 --min-time 0.3 2>&1 | grep -E "^(mlp_f32|bert_layer_f32) +(compiled|onnx_import|loaded)|rror|FAIL"
date
