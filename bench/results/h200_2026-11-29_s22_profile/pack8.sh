#!/usr/bin/env bash
# session 22, call 8: bert_prof against build/dev's runtime (the working tree: small_gemm_warps' knob)
set -e
cd /work/main
P=.device-build/s22
rm -rf /tmp/s22pack && mkdir -p /tmp/s22pack/t
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_VOCAB='"tests/data/bert/vocab.txt"' -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/bert_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s22pack/t/bert_prof
strip /tmp/s22pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s22pack t
ls -la $P/bins.tar.gz
