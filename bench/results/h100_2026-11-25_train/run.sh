#!/usr/bin/env bash
set -uo pipefail
t0=$SECONDS
D=/opt/kdeps; mkdir -p $D; for f in .device-build/debs/*.deb; do dpkg -x $f $D; done
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF -DCMAKE_PREFIX_PATH=$D/usr -DKILN_BUILD_EXAMPLES=ON > $OUT/cmake.log 2>&1
cmake --build build/gpu -j16 --target kiln_bench example_train_mlp example_train_digits > $OUT/build.log 2>&1 || { grep -E "error|FAILED" $OUT/build.log | head -30; exit 1; }
echo "build: $((SECONDS - t0)) s"
build/gpu/examples/example_train_mlp --cuda | tail -2
python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train.json --min-time 0.5 2>&1 | grep torch_train_anchor
build/gpu/bench/kiln_bench --no-cpu --filter mlp_train --min-time 0.5 --json $OUT/kiln_train.json 2>&1 | grep -E "^mlp_train|kernels"
python3 bench/anchors/torch_train_anchor.py --json $OUT/torch_train2.json --min-time 0.5 2>&1 | grep torch_train_anchor
echo "== full GPU bench at $((SECONDS - t0)) s"
timeout $((590 - SECONDS)) build/gpu/bench/kiln_bench --no-cpu --min-time 0.3 --json $OUT/kiln_gpu.json > $OUT/kiln_gpu.txt 2>&1; echo "bench exit $? at $((SECONDS - t0)) s"
grep -A40 "GPU summary" $OUT/kiln_gpu.txt | head -30
