#!/usr/bin/env bash
# session 17: packs stripped binaries for the device: t/ (tests named in TESTS, kiln_bench when BENCH=1, probes)
set -e
cd /work/main
P=.device-build/s17
rm -rf /tmp/s17pack && mkdir -p /tmp/s17pack/t
for t in ${TESTS:-}; do cp build/dev/tests/kiln_test_$t /tmp/s17pack/t/; done
[ "${BENCH:-0}" = 1 ] && cp build/dev/bench/kiln_bench /tmp/s17pack/t/
[ -x /tmp/import_probe_old ] && cp /tmp/import_probe_old /tmp/s17pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DONNX_ML=1 -DONNX_NAMESPACE=onnx -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_CODEGEN_CXX=\"/usr/bin/c++\" -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/import_probe.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -lonnx -lonnx_proto -lprotobuf -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s17pack/t/import_probe
strip /tmp/s17pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s17pack t
ls -la $P/bins.tar.gz
