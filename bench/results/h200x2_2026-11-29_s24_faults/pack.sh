#!/usr/bin/env bash
# packs binaries for the device: t/ (kiln_ddp_bench, kiln_test_dist stripped; kiln_dist_worker with its symbol table, for stacks)
set -e
cd /work/main
P=.device-build/s24
rm -rf /tmp/s24pack && mkdir -p /tmp/s24pack/t
cp build/dev/bench/kiln_ddp_bench build/dev/tests/kiln_test_dist build/dev/tests/kiln_dist_worker /tmp/s24pack/t/
strip /tmp/s24pack/t/kiln_ddp_bench /tmp/s24pack/t/kiln_test_dist
tar czf $P/bins.tar.gz -C /tmp/s24pack t
ls -la $P/bins.tar.gz
