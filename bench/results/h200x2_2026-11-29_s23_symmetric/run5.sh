#!/usr/bin/env bash
# session 23, call 5 (2 x H200): window buckets all-reduced with ncclRedOpCreatePreMulSum (1/world
# folded into NCCL's reduction: KILN_DDP_PREMUL=1, f32 buckets) against sum + scale kernel and the
# default (ordinary memory, avg); BERT layer 32 x 128 and the MLP, reduce_overhead, alternating.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s23
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kcb
date; t0=$SECONDS
for w in "bert_layer_train 32 2" "mlp_train 0 2"; do set -- $w
  B="--workloads $1 --methods reduce_overhead --min-time 0.3 --batch $2"
  for round in $(seq $3); do for v in "0" "1" "1 KILN_DDP_PREMUL=1"; do set -- $v
    echo -n "symmetric=$v: "; env ${2:-X=1} timeout 100 bash tools/kilnrun --nproc 2 $P/t/kiln_ddp_bench $B --symmetric $1 2>&1 | grep -E "GPU|rror" | head -2
  done; done
  echo "at $((SECONDS - t0)) s"
done
date
