#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (tests, kiln_bench, kiln_ddp_bench, resnet_prof), old/ (resnet_prof at HEAD)
set -e
cd /work/main
P=.device-build/s12
rm -rf /tmp/s12pack && mkdir -p /tmp/s12pack/t /tmp/s12pack/old
for t in cuda_ops nn compile autograd dist fuzz cuda_semantics; do cp build/dev/tests/kiln_test_$t /tmp/s12pack/t/; done
cp build/dev/tests/kiln_dist_worker /tmp/s12pack/t/
cp build/dev/bench/kiln_bench build/dev/bench/kiln_ddp_bench /tmp/s12pack/t/
g++ -O2 -DNDEBUG -std=c++20 -DKILN_SEPARATE_COMPILATION -DKILN_WITH_CUDA=1 -Iinclude -isystem /usr/include/eigen3 -isystem /usr/local/cuda/include $P/resnet_prof.cpp build/dev/libkiln_compiled.a /usr/local/cuda/lib/libnvrtc.so /usr/local/cuda/lib/libcublasLt.so -ldl -lpthread -Wl,-rpath,/usr/local/cuda/lib -o /tmp/s12pack/t/resnet_prof
cp /tmp/oldtree/resnet_prof /tmp/s12pack/old/resnet_prof
strip /tmp/s12pack/t/* /tmp/s12pack/old/*
tar czf $P/bins.tar.gz -C /tmp/s12pack t old
ls -la $P/bins.tar.gz
