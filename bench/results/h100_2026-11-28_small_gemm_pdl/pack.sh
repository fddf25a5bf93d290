#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (tests, kiln_bench), bert_prof (new build)
set -e
cd /work/main
P=.device-build/s11
rm -rf /tmp/s11pack && mkdir -p /tmp/s11pack/t
for t in cuda_ops cuda_blas nn compile autograd cuda_semantics export cuda_codegen dist fuzz; do cp build/dev/tests/kiln_test_$t /tmp/s11pack/t/ 2>/dev/null || true; done
cp build/dev/bench/kiln_bench /tmp/s11pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_VOCAB='"tests/data/bert/vocab.txt"' -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/bert_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o $P/bert_prof
strip $P/bert_prof
mkdir -p /tmp/s11pack/old && cp /tmp/oldtree/build/bench/kiln_bench /tmp/s11pack/old/
strip /tmp/s11pack/t/* /tmp/s11pack/old/*
tar czf $P/bins.tar.gz -C /tmp/s11pack t old
ls -la $P/bins.tar.gz
