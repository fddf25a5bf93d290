#!/usr/bin/env bash
# How long kiln takes to compile, on the machine this runs on: wall time and peak memory of one
# g++ process each (-std=c++20 -O2, one core, as a new user's build), for
#   - the README's hello world, header-only, and with separate compilation (the user's file only;
#     the runtime it links, compiled once, is its own row);
#   - a translation unit with a BERT layer compiled and run, both modes;
#   - with --tests BUILD_DIR: each test translation unit, with the flags of that CMake build dir
#     (its compile_commands.json; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON).
#   - a file evaluating eight nested multiply-adds (how a fused loop grows with an expression's depth);
#   - an empty main that includes kiln.hpp (what parsing the header costs), and the rows with
#     KILN_FUSED_LOOPS=0 (no per-expression SIMD loop: every statement on the tile interpreter).
# Usage: bash bench/compile_time.sh [--tests BUILD_DIR] [--json OUT.json]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
TESTS_DIR=""; JSON=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) TESTS_DIR="$2"; shift 2 ;;
    --json) JSON="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "compile_time.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v /usr/bin/time >/dev/null || { echo "compile_time.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
CXX="${CXX:-g++}"
FLAGS=(-std=c++20 -O2 -I"$ROOT/include" -I/usr/include/eigen3)
CUDA_INC=""
for d in /usr/local/cuda/include /usr/include; do
  if [ -f "$d/nvrtc.h" ] && [ -f "$d/cublasLt.h" ]; then CUDA_INC="$d"; break; fi
done
# as CMake's kiln::kiln target does when it finds the CUDA toolkit
[ -n "$CUDA_INC" ] && FLAGS+=(-DKILN_WITH_CUDA=1 -isystem "$CUDA_INC")
OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT
ROWS=()

# measure NAME FILE [EXTRA FLAGS...]: one compile, -c, prints and records the row
measure() {
  local name="$1" src="$2"; shift 2
  local log="$OUT/time.log"
  if ! /usr/bin/time -f "%e %M" -o "$log" "$CXX" "${FLAGS[@]}" "$@" -c "$src" -o "$OUT/x.o" 2> "$OUT/err.log"; then
    echo "compile_time.sh: $name failed to compile:" >&2; head -20 "$OUT/err.log" >&2; exit 1
  fi
  local wall rss text
  read -r wall rss < <(tail -n1 "$log")
  text="$(size "$OUT/x.o" | awk 'NR==2{print $1}')"
  printf "%-44s %8.2f s %8.0f MB %8.0f KB code\n" "$name" "$wall" "$((rss / 1024))" "$((text / 1024))"
  ROWS+=("{\"what\": \"$name\", \"wall_s\": $wall, \"peak_rss_mb\": $((rss / 1024)), \"code_kb\": $((text / 1024))}")
}

echo "kiln compile times on $(uname -n): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $("$CXX" --version | head -1)"
echo "flags: ${FLAGS[*]}"
measure "hello world, header-only" bench/compile_time/hello.cpp
measure "hello world, separate (user file)" bench/compile_time/hello.cpp -DKILN_SEPARATE_COMPILATION
measure "hello world, separate, KILN_FUSED_LOOPS=0" bench/compile_time/hello.cpp -DKILN_SEPARATE_COMPILATION -DKILN_FUSED_LOOPS=0
measure "empty main including kiln.hpp, separate" bench/compile_time/empty.cpp -DKILN_SEPARATE_COMPILATION
measure "runtime for separate mode (once per program)" src/kiln_compiled.cpp -DKILN_SEPARATE_COMPILATION
measure "eight nested multiply-adds, separate" bench/compile_time/nested_adds.cpp -DKILN_SEPARATE_COMPILATION
measure "BERT layer compiled and run, header-only" bench/compile_time/bert_layer.cpp
measure "BERT layer compiled and run, separate" bench/compile_time/bert_layer.cpp -DKILN_SEPARATE_COMPILATION
measure "BERT layer, separate, KILN_FUSED_LOOPS=0" bench/compile_time/bert_layer.cpp -DKILN_SEPARATE_COMPILATION -DKILN_FUSED_LOOPS=0

if [ -n "$TESTS_DIR" ]; then
  [ -f "$TESTS_DIR/compile_commands.json" ] || { echo "compile_time.sh: $TESTS_DIR/compile_commands.json missing" >&2; exit 1; }
  echo "test translation units, with the flags of $TESTS_DIR:"
  while IFS=$'\t' read -r dir file cmd; do
    log="$OUT/t.log"
    ( cd "$dir" && /usr/bin/time -f "%e %M" -o "$log" bash -c "$cmd -o $OUT/t.o" ) 2> "$OUT/err.log" ||
      { echo "compile_time.sh: $file failed" >&2; head -20 "$OUT/err.log" >&2; exit 1; }
    read -r wall rss < <(tail -n1 "$log")
    printf "%-44s %8.2f s %8.0f MB\n" "$(basename "$file")" "$wall" "$((rss / 1024))"
    ROWS+=("{\"what\": \"$(basename "$file")\", \"wall_s\": $wall, \"peak_rss_mb\": $((rss / 1024))}")
  done < <(python3 - "$TESTS_DIR/compile_commands.json" <<'P'
import json, sys, re
for d in json.load(open(sys.argv[1])):
    if '/tests/test_' not in d['file'] and not d['file'].endswith('kiln_compiled.cpp'): continue
    cmd = re.sub(r' -o \S+', '', d['command'])
    print(d['directory'] + '\t' + d['file'] + '\t' + cmd)
P
)
fi
if [ -n "$JSON" ]; then
  { echo "["; (IFS=$',\n'; echo "${ROWS[*]}"); echo "]"; } > "$JSON"
  echo "wrote $JSON"
fi
