#!/usr/bin/env bash
set -uo pipefail
t0=$SECONDS
D=/opt/kdeps; mkdir -p $D; for f in .device-build/debs/*.deb; do dpkg -x $f $D; done
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DCMAKE_PREFIX_PATH=$D/usr > $OUT/cmake.log 2>&1
cmake --build build/gpu -j16 --target kiln_bench kiln_test_autograd kiln_test_cuda_ops > $OUT/build.log 2>&1 || { grep -E "error|FAILED" $OUT/build.log | head -30; exit 1; }
echo "build: $((SECONDS - t0)) s"
export KILN_CACHE_DIR=$(mktemp -d)
for t in autograd cuda_ops; do build/gpu/tests/kiln_test_$t --test-suite-exclude=no_gpu,download --no-skip > $OUT/t_$t.log 2>&1; echo "$t exit $?"; grep -E "test cases:|ERROR" $OUT/t_$t.log | head -10; done
unset KILN_CACHE_DIR
echo "tests done at $((SECONDS - t0)) s"
timeout 240 build/gpu/bench/kiln_bench --no-cpu --filter _train --min-time 0.5 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln exit $?"
grep -E "_train|first step|graphs" $OUT/kiln_train.txt
echo "kiln bench done at $((SECONDS - t0)) s"
timeout $((590 - SECONDS)) python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.5 2>&1 | grep torch_train_anchor
echo "at $((SECONDS - t0)) s"
