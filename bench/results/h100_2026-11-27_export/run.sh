#!/usr/bin/env bash
# session of 2026-11-27 (issue 16): exported programs on CUDA. The examples exported on the GPU and
# loaded in another process on the GPU; kiln_bench's model rows on the H100 (compiled vs the saved and
# loaded program); PyTorch's export times for the same models (torch.export, torch.onnx.export dynamo=True).
set -o pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
B=build/dev
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
date
timeout 60 $B/examples/example_export_deploy /tmp/exp --cuda > $OUT/deploy.txt 2>&1; echo "deploy rc=$?" >> $OUT/deploy.txt
timeout 100 $B/examples/example_export_deploy --run /tmp/exp/mlp.kiln /tmp/exp/mlp.check.safetensors /tmp/exp/bert_layer.kiln \
  /tmp/exp/bert_layer.check.safetensors /tmp/exp/resnet18.kiln /tmp/exp/resnet18.check.safetensors --cuda >> $OUT/deploy.txt 2>&1; echo "run rc=$?" >> $OUT/deploy.txt
# the same files on the CPU (exported from CUDA tensors, loaded on the host)
timeout 100 $B/examples/example_export_deploy --run /tmp/exp/mlp.kiln /tmp/exp/mlp.check.safetensors >> $OUT/deploy.txt 2>&1; echo "run cpu rc=$?" >> $OUT/deploy.txt
tail -12 $OUT/deploy.txt
date
for f in mlp_f32 bert_layer_f32 resnet18; do
  timeout 110 $B/bench/kiln_bench --no-cpu --min-time 0.1 --filter $f --json $OUT/bench_$f.json > $OUT/bench_$f.txt 2>&1; echo "$f rc=$?"
  grep -E "^$f " $OUT/bench_$f.txt | grep -E " (compiled|loaded|reduce_overhead) " | head -6
done
date
timeout 170 python3 bench/anchors/torch_export_time.py --device cuda --repeats 3 --json $OUT/torch_export.json > $OUT/torch_export.txt 2>&1; echo "torch rc=$?" >> $OUT/torch_export.txt
cat $OUT/torch_export.txt | grep -v Warning | tail -12
cd $OUT && tar czf bench.tgz bench_*.json bench_*.txt && rm -f bench_*.json bench_*.txt
