#!/usr/bin/env bash
# session 16: packs stripped binaries for the device: t/ (tests named in TESTS, kiln_bench when BENCH=1, probes)
set -e
cd /work/main
P=.device-build/s16
rm -rf /tmp/s16pack && mkdir -p /tmp/s16pack/t
for t in ${TESTS:-}; do cp build/dev/tests/kiln_test_$t /tmp/s16pack/t/; done
[ "${BENCH:-0}" = 1 ] && cp build/dev/bench/kiln_bench /tmp/s16pack/t/
[ "${DDP:-0}" = 1 ] && cp build/dev/bench/kiln_ddp_bench /tmp/s16pack/t/
[ -x /tmp/mem_probe_old ] && cp /tmp/mem_probe_old /tmp/s16pack/t/
for p in mem_probe stale_probe; do
  g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -DKILN_CODEGEN_CXX=\"/usr/bin/c++\" -Iinclude -Ibench -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/$p.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s16pack/t/$p
done
strip /tmp/s16pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s16pack t
ls -la $P/bins.tar.gz
