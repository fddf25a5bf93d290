#!/usr/bin/env bash
# session 22, call 6: the unity unit-test and CUDA-test executables of build/s1 (Release -O2, KILN_NATIVE=OFF) at HEAD, stripped
set -e
cd /work/main
P=.device-build/s22
rm -rf /tmp/s22pack && mkdir -p /tmp/s22pack/t
cp build/s1/tests/kiln_unit_tests_0 build/s1/tests/kiln_unit_tests_1 build/s1/tests/kiln_unit_tests_2 build/s1/tests/kiln_cuda_tests_0 build/s1/tests/kiln_cuda_tests_1 /tmp/s22pack/t/
strip /tmp/s22pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s22pack t
ls -la $P/bins.tar.gz
