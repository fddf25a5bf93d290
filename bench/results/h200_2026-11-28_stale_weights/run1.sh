#!/bin/bash
# call 1: peak memory (simulated live set and the allocator's peak) and first-step times
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for w in mlp_train bert_layer_train resnet18_train; do
  rm -rf /tmp/kc; export KILN_CACHE_DIR=/tmp/kc
  echo "=== $w cold"; KILN_LOGS=memory,compile_times ./mem_probe $w cuda 2>&1
  echo "=== $w warm disk cache"; KILN_LOGS=compile_times ./mem_probe $w cuda 2>&1
  echo "=== $w reduce_overhead"; ./mem_probe $w cuda ro 2>&1
done
