#!/usr/bin/env bash
# session 22, call 2: bert-base bf16 row kernels (residual + LayerNorm, 768 columns): the launch
# shape knobs (KILN_CUDA_ROW_LANES: threads per row, KILN_CUDA_ROW_ELEMS: values per thread) against
# the default, alternating; bert_prof reduce_overhead, 50 calls back to back.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
run() { echo "-- $1 $2: $(env $1 timeout 60 $P/t/bert_prof reduce_overhead bf16 $2 2>&1 | grep -E "us per|rror" | tail -2 | awk '{print $4}' | tr '\n' ' ')"; }
for s in b1 b8x128; do
  for rep in 1 2; do
    for e in KILN_X=0 KILN_CUDA_ROW_LANES=32 KILN_CUDA_ROW_LANES=16 KILN_CUDA_ROW_ELEMS=32 KILN_CUDA_ROW_ELEMS=8 "KILN_CUDA_ROW_LANES=32 KILN_CUDA_ROW_ELEMS=32"; do run "$e" $s; done
  done
done
echo "at $((SECONDS - t0)) s"; date
