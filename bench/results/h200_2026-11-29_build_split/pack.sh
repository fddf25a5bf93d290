#!/usr/bin/env bash
# session 18: packs stripped binaries for the device: t/ (tests named in TESTS, kiln_bench when BENCH=1, examples)
set -e
cd /work/main
P=.device-build/s18
rm -rf /tmp/s18pack && mkdir -p /tmp/s18pack/t
for t in ${TESTS:-}; do cp build/dev/tests/kiln_test_$t /tmp/s18pack/t/; done
[ "${BENCH:-0}" = 1 ] && cp build/dev/bench/kiln_bench /tmp/s18pack/t/
for e in ${EXAMPLES:-}; do cp build/dev/examples/example_$e /tmp/s18pack/t/; done
[ -x build/dev/tests/kiln_onnx_node_tests ] && [ "${NODE:-0}" = 1 ] && cp build/dev/tests/kiln_onnx_node_tests /tmp/s18pack/t/
strip /tmp/s18pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s18pack t
ls -la $P/bins.tar.gz
