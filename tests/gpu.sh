#!/usr/bin/env bash
# The GPU suite, for a machine with a CUDA device: every test binary (the CUDA ones run their GPU
# cases there; test_dist's multi_gpu suite where there are 2 GPUs or more, multi_gpu4 where 4), compute-sanitizer
# memcheck over the CUDA tests, then the GPU bench rows.
#   bash tests/gpu.sh [BUILD_DIR]      (default build/gpu; logs and JSON go to $OUT or /tmp/kiln-gpu)
# Build first (here or elsewhere) with:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DKILN_NATIVE=OFF && cmake --build build/gpu -j
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B="${1:-build/gpu}"
OUT="${OUT:-/tmp/kiln-gpu}"
mkdir -p "$OUT"
export KILN_CACHE_DIR="$(mktemp -d)"
export KILN_RUN="$PWD/tools/kilnrun"  # test_dist starts its ranks through the launcher of this tree
status=0
nvidia-smi -L || true
# the suite multi_gpu (several processes on several GPUs, test_dist) runs where there are 2 GPUs or
# more, multi_gpu4 where there are 4 or more
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' )
left_out_suites=no_gpu,download
[ "$gpus" -ge 4 ] || left_out_suites=no_gpu,download,multi_gpu4
[ "$gpus" -ge 2 ] || left_out_suites=no_gpu,download,multi_gpu,multi_gpu4
echo "== $gpus GPUs: suites left out: $left_out_suites"
# test_cuda_codegen compiles every kernel family for sm_80 too here, to cubins (CI compiles for
# sm_90 only, to PTX)
export KILN_TEST_CUDA_ARCHS="${KILN_TEST_CUDA_ARCHS:-80,90}" KILN_TEST_CUDA_SASS="${KILN_TEST_CUDA_SASS:-1}"
for t in cuda_runtime cuda_nvrtc cuda_blas cuda_codegen cuda_ops cuda_semantics autograd dist bert nn nn_io ops_sweep shape_ops compile compile_semantics core expr errors cpu_backend; do
  exe="$B/tests/kiln_test_$t"
  [ -x "$exe" ] || { echo "== $t: not built in $B"; status=1; continue; }
  echo "== $t"
  # the tests of what kiln says without a GPU (test suite no_gpu) are left out, and so are those
  # of a model fetched from PyPI (suite download: the GPU machine has no network); every other
  # test runs here even where it would skip itself (--no-skip): a GPU test that cannot run on this
  # machine fails the suite instead of being skipped. (doctest counts the tests the filter left
  # out as "skipped" in its summary: that many are expected, no more.)
  if ! "$exe" --test-suite-exclude="$left_out_suites" --no-skip > "$OUT/test_$t.log" 2>&1; then status=1; fi
  grep -E "test cases:|assertions:|Status" "$OUT/test_$t.log" | tail -3
  grep -E "ERROR|FAILED|error:" "$OUT/test_$t.log" | head -20
  left_out="$("$exe" --test-suite="$left_out_suites" --no-skip --count 2>/dev/null | sed -n 's/.*filters: *\([0-9]*\).*/\1/p')"
  skipped="$(sed -n 's/.*| *\([0-9]*\) skipped.*/\1/p' "$OUT/test_$t.log" | tail -n1)"
  if [ "${skipped:-0}" != "${left_out:-0}" ]; then
    echo "== $t: ${skipped:-?} test cases skipped, ${left_out:-0} expected (the suites $left_out_suites)"; status=1
  fi
done
if command -v compute-sanitizer > /dev/null; then
  # Memory kiln caches on purpose (allocator blocks, pinned staging, cuBLASLt workspaces) lives
  # until exit, so no --leak-check; the out-of-memory test provokes a failing cuMemAlloc on
  # purpose, which memcheck would count, so it is left out here (it runs above).
  for t in cuda_runtime cuda_blas cuda_ops cuda_semantics; do
    echo "== compute-sanitizer memcheck $t"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/kiln_test_$t" -tce='*out of memory*' > "$OUT/memcheck_$t.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|test cases:" "$OUT/memcheck_$t.log" | tail -2
  done
else
  echo "compute-sanitizer not found"
fi
if [ -x "$B/tests/kiln_test_fuzz" ]; then
  # the differential fuzzer on the GPU: KILN_FUZZ_GRAPHS programs (default 2000) against the
  # float64 interpreter, split over as many processes as there are cores
  n=${KILN_FUZZ_GRAPHS:-2000}; p=$(nproc); per=$(( (n + p - 1) / p ))
  echo "== fuzz on CUDA: $n programs in $p processes"
  for i in $(seq 0 $((p - 1))); do
    KILN_FUZZ_DEVICE=cuda KILN_FUZZ_SEED0=$((i * per)) KILN_FUZZ_GRAPHS=$per "$B/tests/kiln_test_fuzz" > "$OUT/fuzz_$i.log" 2>&1 &
  done
  wait || true
  cat "$OUT"/fuzz_*.log > "$OUT/fuzz.log"; rm -f "$OUT"/fuzz_[0-9]*.log
  grep -E "^fuzz|programs|test cases:" "$OUT/fuzz.log" | sort | uniq -c | head -20
  grep -q "Status: FAILURE" "$OUT/fuzz.log" && status=1
fi
if [ -n "${KILN_TUNE:-}" ] && [ -x "$B/bench/kiln_bench" ]; then
  # launch-shape sweep (KILN_TUNE=1): the GPU rows under each setting, compiled method only
  for u in 1 2; do echo "== KILN_CUDA_EW_UNROLL=$u"; KILN_CUDA_EW_UNROLL=$u "$B/bench/kiln_bench" --no-cpu --filter chain64M --min-time 0.2 | grep -E "compiled|fused"; done
  for w in 1 4 1000000; do echo "== KILN_CUDA_EW_WAVES=$w"; for f in chain64M scale64M; do KILN_CUDA_EW_WAVES=$w "$B/bench/kiln_bench" --no-cpu --filter $f --min-time 0.2 | grep -E "compiled|fused"; done; done
  for r in 8 16 32; do echo "== KILN_CUDA_ROW_ELEMS=$r"; for w in softmax layernorm; do KILN_CUDA_ROW_ELEMS=$r "$B/bench/kiln_bench" --no-cpu --filter $w --min-time 0.2 | grep -E "compiled"; done; done
fi
if [ -x "$B/bench/kiln_bench" ]; then
  echo "== kiln_bench (GPU rows)"
  "$B/bench/kiln_bench" --no-cpu --min-time 0.3 --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log" || status=1
fi
exit $status
