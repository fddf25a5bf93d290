#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (kiln_ddp_bench, kiln_bench, dist tests and worker, GPU suites)
set -e
cd /work/main
P=.device-build/s14
rm -rf /tmp/s14pack && mkdir -p /tmp/s14pack/t
for t in ${TESTS:-dist}; do cp build/dev/tests/kiln_test_$t /tmp/s14pack/t/; done
cp build/dev/tests/kiln_dist_worker /tmp/s14pack/t/
cp build/dev/bench/kiln_ddp_bench ${EXTRA:-} /tmp/s14pack/t/
strip /tmp/s14pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s14pack t
ls -la $P/bins.tar.gz
