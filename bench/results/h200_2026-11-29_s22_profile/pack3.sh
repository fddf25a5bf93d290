#!/usr/bin/env bash
# session 22, call 3: new (working tree) kiln_bench and bert_prof from build/dev, the old ones (HEAD
# 1575c35, call 1's) as *_old, the CUDA test executables of build/s1 (unity, -O2)
set -e
cd /work/main
P=.device-build/s22
rm -rf /tmp/s22pack && mkdir -p /tmp/s22pack/t
cp build/dev/bench/kiln_bench /tmp/s22pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_VOCAB='"tests/data/bert/vocab.txt"' -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/bert_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s22pack/t/bert_prof
cp /tmp/old/t/kiln_bench /tmp/s22pack/t/kiln_bench_old; cp /tmp/old/t/bert_prof /tmp/s22pack/t/bert_prof_old
cp build/s1/tests/kiln_cuda_tests_0 build/s1/tests/kiln_cuda_tests_1 /tmp/s22pack/t/
strip /tmp/s22pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s22pack t
ls -la $P/bins.tar.gz
