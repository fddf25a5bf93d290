#!/usr/bin/env bash
# session 22, call 8: the small products' warps at batch 1 (KILN_CUDA_SMALL_GEMM_PIECES: pieces of
# 32 k's per warp, 3 = the default; 2 and 1 give k = 768's products 16 and 32 warps a block);
# bert_prof reduce_overhead bf16 b1, alternating
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s22
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
for rep in 1 2 3; do for v in 3 2 1; do
  echo "-- pieces $v b1: $(KILN_CUDA_SMALL_GEMM_PIECES=$v timeout 60 $P/t/bert_prof reduce_overhead bf16 b1 2>&1 | grep -E "us per|rror" | tail -2 | awk '{print $4}' | tr '\n' ' ')"
done; done
echo "at $((SECONDS - t0)) s"; date
