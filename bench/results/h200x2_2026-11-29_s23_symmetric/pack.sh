#!/usr/bin/env bash
# packs stripped binaries for the device: t/ (kiln_ddp_bench, kiln_test_dist, kiln_dist_worker; build/dev)
set -e
cd /work/main
P=.device-build/s23
rm -rf /tmp/s23pack && mkdir -p /tmp/s23pack/t
cp build/dev/bench/kiln_ddp_bench build/dev/tests/kiln_test_dist build/dev/tests/kiln_dist_worker /tmp/s23pack/t/
strip /tmp/s23pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s23pack t
ls -la $P/bins.tar.gz
