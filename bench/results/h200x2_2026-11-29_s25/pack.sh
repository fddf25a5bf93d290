#!/usr/bin/env bash
# packs binaries for the device: t/ (kiln_ddp_bench, kiln_test_dist stripped; kiln_dist_worker with its symbol table, for stacks)
set -e
cd /work/main
P=.device-build/s25
rm -rf /tmp/s25pack && mkdir -p /tmp/s25pack/t
cp build/dev/bench/kiln_ddp_bench build/dev/tests/kiln_test_dist build/dev/tests/kiln_dist_worker /tmp/s25pack/t/
strip /tmp/s25pack/t/kiln_ddp_bench /tmp/s25pack/t/kiln_test_dist
tar czf $P/bins.tar.gz -C /tmp/s25pack t
ls -la $P/bins.tar.gz
