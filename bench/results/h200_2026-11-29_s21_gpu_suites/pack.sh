#!/usr/bin/env bash
# session 21: the unity test executables of build/s1 (Release -O2, KILN_NATIVE=OFF), stripped
set -e
cd /work/main
P=.device-build/s21
rm -rf /tmp/s21pack && mkdir -p /tmp/s21pack/t
cp build/s1/tests/kiln_cuda_tests_0 build/s1/tests/kiln_cuda_tests_1 build/s1/tests/kiln_unit_tests_0 build/s1/tests/kiln_unit_tests_1 build/s1/tests/kiln_unit_tests_2 /tmp/s21pack/t/
strip /tmp/s21pack/t/*
tar czf $P/bins.tar.gz -C /tmp/s21pack t
ls -la $P/bins.tar.gz
