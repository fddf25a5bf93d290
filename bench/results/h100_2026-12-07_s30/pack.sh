#!/usr/bin/env bash
# session 30: packs stripped binaries for the device: new/ (this tree, build/dev: Release, KILN_NATIVE=OFF)
# and old/kiln_bench (a03926d's kiln_bench, saved in /tmp/kiln_bench_old), lib/ (libonnx, protobuf)
set -e
cd /work/main
P=.device-build/s30
rm -rf /tmp/s30pack && mkdir -p /tmp/s30pack/new /tmp/s30pack/old
cp build/dev/bench/kiln_bench build/dev/tests/kiln_test_autograd build/dev/tests/kiln_test_cuda_ops /tmp/s30pack/new/
cp /tmp/kiln_bench_old /tmp/s30pack/old/kiln_bench
strip /tmp/s30pack/new/* /tmp/s30pack/old/*
rm -rf $P/lib && mkdir -p $P/lib && cp -L /lib/x86_64-linux-gnu/libonnx.so.1 /lib/x86_64-linux-gnu/libonnx_proto.so.1 /lib/x86_64-linux-gnu/libprotobuf.so.32 $P/lib/
tar czf $P/bins.tar.gz -C /tmp/s30pack new old
ls -la $P/bins.tar.gz
