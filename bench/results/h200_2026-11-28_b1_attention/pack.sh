#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (tests named in TESTS, kiln_bench when BENCH=1), bert_prof
set -e
cd /work/main
P=.device-build/s15
rm -rf /tmp/s15pack && mkdir -p /tmp/s15pack/t
for t in ${TESTS:-cuda_ops}; do cp build/dev/tests/kiln_test_$t /tmp/s15pack/t/; done
[ -x /tmp/bert_prof_old ] && cp /tmp/bert_prof_old /tmp/s15pack/t/
[ "${BENCH:-0}" = 1 ] && cp build/dev/bench/kiln_bench /tmp/s15pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_VOCAB='"tests/data/bert/vocab.txt"' -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/bert_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s15pack/t/bert_prof
strip /tmp/s15pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s15pack t
ls -la $P/bins.tar.gz
