#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (tests, kiln_bench, kiln_ddp_bench, resnet_prof)
set -e
cd /work/main
P=.device-build/s13
rm -rf /tmp/s13pack && mkdir -p /tmp/s13pack/t /tmp/s13pack/old
for t in cuda_ops nn compile autograd dist fuzz cuda_semantics; do cp build/dev/tests/kiln_test_$t /tmp/s13pack/t/; done
cp build/dev/tests/kiln_dist_worker /tmp/s13pack/t/
cp build/dev/bench/kiln_bench build/dev/bench/kiln_ddp_bench /tmp/s13pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/resnet_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s13pack/t/resnet_prof
cp /tmp/oldtree/resnet_prof /tmp/s13pack/old/ 2>/dev/null || true
strip /tmp/s13pack/t/* /tmp/s13pack/old/* 2>/dev/null || true
tar czf $P/bins.tar.gz -C /tmp/s13pack t old
ls -la $P/bins.tar.gz
