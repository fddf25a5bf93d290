#!/usr/bin/env bash
# session 24, calls 4-5: the unity test executables of build/s24gpu (Release -O2, KILN_NATIVE=OFF,
# KILN_UNITY_TESTS=ON) and the dist worker, stripped
set -e
cd /work/main
P=.device-build/s24
rm -rf /tmp/s24pack4 && mkdir -p /tmp/s24pack4/t
cp build/s24gpu/tests/kiln_cuda_tests_0 build/s24gpu/tests/kiln_cuda_tests_1 build/s24gpu/tests/kiln_unit_tests_0 build/s24gpu/tests/kiln_unit_tests_1 build/s24gpu/tests/kiln_unit_tests_2 build/s24gpu/tests/kiln_dist_worker /tmp/s24pack4/t/
strip /tmp/s24pack4/t/*
tar czf $P/bins.tar.gz -C /tmp/s24pack4 t
ls -la $P/bins.tar.gz
