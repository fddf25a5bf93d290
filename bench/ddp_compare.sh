#!/usr/bin/env bash
# Data-parallel training, kiln and PyTorch side by side on this machine's GPUs, in one session:
# kiln_ddp_bench on 1 GPU (no DataParallel) and on N (tools/kilnrun, DataParallel over NCCL), then
# bench/anchors/torch_ddp_anchor.py the same two ways (torchrun; DistributedDataParallel and
# torch.compile), then bench/ddp_report.py (scaling, kiln vs torch).
#   bash bench/ddp_compare.sh [BUILD_DIR] [OUTDIR] [N]
# Environment: WORKLOADS (default all three), KILN_METHODS (compiled,reduce_overhead),
# TORCH_METHODS (compile,compile_ro), MIN_TIME (0.3 s per throughput run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B="${1:-build/rel}"
OUT="${2:-/tmp/kiln-ddp}"
N="${3:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')}"
W="${WORKLOADS:-mlp_train,bert_layer_train,resnet18_train}"
T="${MIN_TIME:-0.3}"
mkdir -p "$OUT"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d)}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # never NVLink multicast (see the GPU machine's notes)
status=0
nvidia-smi -L
echo "== kiln, 1 GPU"
timeout 200 "$B/bench/kiln_ddp_bench" --workloads "$W" --methods "${KILN_METHODS:-compiled,reduce_overhead}" --min-time "$T" --json "$OUT/kiln_1.json" || status=1
echo "== kiln, $N GPUs"
timeout 200 bash tools/kilnrun --nproc "$N" "$B/bench/kiln_ddp_bench" --workloads "$W" --methods "${KILN_METHODS:-compiled,reduce_overhead}" \
  --min-time "$T" --json "$OUT/kiln_$N.json" || status=1
if python3 -c "import torch" 2>/dev/null; then
  for n in 1 "$N"; do
    echo "== torch, $n GPU(s)"
    timeout 240 torchrun --standalone --nproc_per_node "$n" bench/anchors/torch_ddp_anchor.py --workloads "$W" \
      --methods "${TORCH_METHODS:-compile,compile_ro}" --min-time "$T" --json "$OUT/torch_$n.json" || status=1
  done
  python3 bench/ddp_report.py --kiln "$OUT/kiln_1.json" "$OUT/kiln_$N.json" --torch "$OUT/torch_1.json" "$OUT/torch_$N.json" \
    --out "$OUT/report.md" || status=1
else
  python3 bench/ddp_report.py --kiln "$OUT/kiln_1.json" "$OUT/kiln_$N.json" --out "$OUT/report.md" || status=1
fi
exit $status
