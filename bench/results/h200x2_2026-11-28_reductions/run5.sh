#!/usr/bin/env bash
# session 12, call 5 (1 x H200): the data-parallel bench's single-GPU rows at the compute-bound
# batches (ResNet-18 64, BERT layer 32 x 128): kiln_ddp_bench on 1 GPU (no DataParallel) and
# torch_ddp_anchor.py under torchrun on 1 GPU (DDP + torch.compile reduce-overhead), one call.
cd "$(dirname "$0")" && rm -rf t bd && tar xzf bins.tar.gz && mkdir -p bd && ln -s ../t bd/bench && cd - > /dev/null
P=.device-build/s12
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; date; t0=$SECONDS
for w in resnet18_train:64:r64 bert_layer_train:32:b32; do IFS=: read wl ba tg <<< "$w"
  timeout 200 $P/t/kiln_ddp_bench --workloads $wl --methods reduce_overhead --min-time 0.3 --batch $ba --json $OUT/kiln_$tg.json > $OUT/ddp_$tg.log 2>&1; echo "kiln $tg rc=$? at $((SECONDS - t0)) s"
  timeout 240 torchrun --standalone --nproc_per_node 1 bench/anchors/torch_ddp_anchor.py --workloads $wl --methods compile_ro --min-time 0.3 --batch $ba --json $OUT/torch_$tg.json >> $OUT/ddp_$tg.log 2>&1; echo "torch $tg rc=$? at $((SECONDS - t0)) s"
  python3 bench/ddp_report.py --kiln $OUT/kiln_$tg.json --torch $OUT/torch_$tg.json --out $OUT/report_$tg.md >> $OUT/ddp_$tg.log 2>&1
  grep -v "^\s*$" $OUT/report_$tg.md | head -20
done
grep -iE "error|Traceback" $OUT/ddp_*.log | head -10
date
