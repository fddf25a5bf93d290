#!/usr/bin/env bash
# packs stripped binaries for the device: t/kiln_bench, t/bert_prof, CUDA tests (build/dev, Release, KILN_NATIVE=OFF)
set -e
cd /work/main
P=.device-build/s28
rm -rf /tmp/s28pack && mkdir -p /tmp/s28pack/t
cp build/dev/bench/kiln_bench build/dev/tests/kiln_test_cuda_ops build/dev/tests/kiln_test_cuda_blas /tmp/s28pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_VOCAB='"tests/data/bert/vocab.txt"' -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/bert_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib64/libnvrtc.so /usr/local/cuda/lib64/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/s28pack/t/bert_prof
strip /tmp/s28pack/t/*
rm -rf $P/lib && mkdir -p $P/lib && cp -L /lib/x86_64-linux-gnu/libonnx.so.1 /lib/x86_64-linux-gnu/libonnx_proto.so.1 /lib/x86_64-linux-gnu/libprotobuf.so.32 $P/lib/
tar czf $P/bins.tar.gz -C /tmp/s28pack t
ls -la $P/bins.tar.gz
