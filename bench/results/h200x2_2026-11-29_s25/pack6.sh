#!/usr/bin/env bash
# session 25, call 6: kiln_ddp_bench, kiln_test_dist, kiln_dist_worker, kiln_test_autograd (build/dev; call 6 also kiln_test_cuda_blas)
set -e
cd /work/main
P=.device-build/s25
rm -rf /tmp/s25pack && mkdir -p /tmp/s25pack/t
cp build/dev/bench/kiln_ddp_bench build/dev/tests/kiln_test_dist build/dev/tests/kiln_dist_worker build/dev/tests/kiln_test_autograd /tmp/s25pack/t/
strip /tmp/s25pack/t/kiln_ddp_bench /tmp/s25pack/t/kiln_test_dist /tmp/s25pack/t/kiln_test_autograd
tar czf $P/bins.tar.gz -C /tmp/s25pack t
rm -f $P/kb.tar.gz
ls -la $P/bins.tar.gz
