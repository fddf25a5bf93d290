#!/usr/bin/env bash
# session 23, call 6 (2 x H200): the die test with symmetric windows under each libnccl.so.2 found
# (the system's 2.28.3, torch's wheel's 2.28.9): does ncclCommAbort return with windows registered?
# Then the BERT layer with and without windows under each.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
libs=$( (ldconfig -p | awk '/libnccl.so.2/ {print $NF}'; find /usr/local /usr/lib /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) -name 'libnccl.so.2*' 2>/dev/null) | sort -u)
echo "libnccl found: $libs"
n=0
for l in $libs; do n=$((n+1))
  echo "== $l"
  for mode in compiled reduce_overhead; do
    NCCL_DEBUG=VERSION KILN_NCCL=$l KILN_LOGS=dist timeout 60 bash tools/kilnrun --nproc 2 --grace 20 $P/t/kiln_dist_worker die --device cuda --at 5 --timeout 120 --mode $mode --model bert --symmetric 1 > $OUT/die_${n}_$mode.txt 2>&1
    echo "$mode rc=$? at $((SECONDS - t0)) s"; grep -E "EXPECTED|aborted|NCCL version|kilnrun" $OUT/die_${n}_$mode.txt | cut -c1-200 | head -6
  done
  B="--workloads bert_layer_train --methods reduce_overhead --min-time 0.3 --batch 32"
  for v in 0 1; do echo -n "symmetric=$v: "; KILN_NCCL=$l timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $v 2>&1 | grep -E "GPU|rror" | head -2; done
done
gzip $OUT/*.txt; date
