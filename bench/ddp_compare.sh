#!/usr/bin/env bash
# Data-parallel training, kiln and PyTorch side by side on this machine's GPUs, in one session:
# kiln_ddp_bench on 1 GPU (no DataParallel) and on each N (tools/kilnrun, DataParallel over NCCL),
# then bench/anchors/torch_ddp_anchor.py the same ways (torchrun; DistributedDataParallel and
# torch.compile), then bench/ddp_report.py (scaling, kiln vs torch).
#   bash bench/ddp_compare.sh [BUILD_DIR] [OUTDIR] [N ...]      (N: default every GPU; e.g. "2 4")
# Environment: WORKLOADS (default all three), KILN_METHODS (compiled,reduce_overhead),
# TORCH_METHODS (compile,compile_ro; "none" skips torch), MIN_TIME (0.3 s per throughput run),
# BATCH (per-GPU batch of every workload; default each workload's own), TAG (file name suffix),
# KILN_DDP_WINDOWS=1 (kiln's buckets in NCCL symmetric windows: DDPOptions::symmetric_memory).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B="${1:-build/rel}"
OUT="${2:-/tmp/kiln-ddp}"
shift 2 2>/dev/null || shift $#
SIZES="${*:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')}"
W="${WORKLOADS:-mlp_train,bert_layer_train,resnet18_train}"
T="${MIN_TIME:-0.3}"
BA="${BATCH:-0}"
TG="${TAG:-}"
mkdir -p "$OUT"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d)}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # never NVLink multicast (see the GPU machine's notes)
status=0
nvidia-smi -L
kj=() tj=()
for n in 1 $SIZES; do
  echo "== kiln, $n GPU(s), batch per GPU ${BA/#0/default}"
  if [ "$n" = 1 ]; then
    timeout 240 "$B/bench/kiln_ddp_bench" --workloads "$W" --methods "${KILN_METHODS:-compiled,reduce_overhead}" --min-time "$T" \
      --batch "$BA" --json "$OUT/kiln_1$TG.json" || status=1
  else
    timeout 240 bash tools/kilnrun --nproc "$n" "$B/bench/kiln_ddp_bench" --workloads "$W" --methods "${KILN_METHODS:-compiled,reduce_overhead}" \
      --min-time "$T" --batch "$BA" --json "$OUT/kiln_$n$TG.json" || status=1
  fi
  kj+=("$OUT/kiln_$n$TG.json")
done
if [ "${TORCH_METHODS:-}" != none ] && python3 -c "import torch" 2>/dev/null; then
  for n in 1 $SIZES; do
    echo "== torch, $n GPU(s)"
    timeout 300 torchrun --standalone --nproc_per_node "$n" bench/anchors/torch_ddp_anchor.py --workloads "$W" \
      --methods "${TORCH_METHODS:-compile,compile_ro}" --min-time "$T" --batch "$BA" --json "$OUT/torch_$n$TG.json" || status=1
    tj+=("$OUT/torch_$n$TG.json")
  done
fi
if [ ${#tj[@]} -gt 0 ]; then
  python3 bench/ddp_report.py --kiln "${kj[@]}" --torch "${tj[@]}" --out "$OUT/report$TG.md" || status=1
else
  python3 bench/ddp_report.py --kiln "${kj[@]}" --out "$OUT/report$TG.md" || status=1
fi
exit $status
