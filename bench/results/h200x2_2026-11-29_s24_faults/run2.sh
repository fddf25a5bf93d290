#!/usr/bin/env bash
# session 24, call 2 (2 x H200): (1) NCCL's CTA settings (read from the environment at communicator
# creation) against the BERT layer's 2-GPU step, windows on and off, two rounds; (2) the die test
# with windows (BERT layer) under torch's wheel's NCCL 2.28.9 and the system's 2.28.3, alternating:
# call 1's stack showed ncclCommAbort (2.28.3) in cuStreamSynchronize behind the symmetric kernel.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s24
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.3 --batch 32"
echo -n "1 GPU: "; timeout 100 $P/t/kiln_ddp_bench $B 2>&1 | grep -E "GPU|rror" | head -2
for r in 1 2; do
  for e in "X=0" "NCCL_CGA_CLUSTER_SIZE=2" "NCCL_MAX_CTAS=8" "NCCL_MAX_CTAS=16" "NCCL_CTA_POLICY=1"; do
    for v in 1 0; do
      echo -n "round $r $e symmetric=$v: "; env $e timeout 60 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2
    done
  done
  echo "at $((SECONDS - t0)) s"
done
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_CTA_POLICY=1 NCCL_MAX_CTAS=8 timeout 60 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric 1 > $OUT/nccl_env.txt 2>&1; grep -iE "CTA|NCCL_|cluster|version" $OUT/nccl_env.txt | head -20
new=$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) -name 'libnccl.so.2' 2>/dev/null | head -1)
old=$(ldconfig -p | awk '/libnccl.so.2 / {print $NF}' | head -1)
echo "new: $new  old: $old"
for l in "$new" "$old"; do echo -n "$l symmetric=1: "; KILN_NCCL=$l timeout 60 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric 1 2>&1 | grep -E "GPU|rror" | head -2; done
n=0
for round in 1 2 3 4 5 6; do for l in "$new" "$old"; do
  [ $((SECONDS - t0)) -gt 530 ] && { echo "stopped at $((SECONDS - t0)) s"; break 2; }
  n=$((n+1)); mode=reduce_overhead; [ $((round % 2)) = 0 ] && mode=compiled
  tag=new; [ "$l" = "$old" ] && tag=old
  s=$SECONDS
  NCCL_DEBUG=VERSION KILN_NCCL=$l KILN_LOGS=dist timeout 40 bash tools/kilnrun --nproc 2 --grace 12 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model bert --symmetric 1 > $OUT/die_${n}_${tag}_$mode.txt 2>&1
  echo "die $n $tag $mode rc=$? in $((SECONDS - s)) s: $(grep -E 'EXPECTED|NCCL version|kilnrun' $OUT/die_${n}_${tag}_$mode.txt | cut -c1-110 | head -4 | tr '\n' '|')"
done; done
gzip $OUT/*.txt 2>/dev/null; date
