#!/usr/bin/env bash
# kiln vs PyTorch in one session on one machine: kiln_bench's rows, the PyTorch anchor (eager,
# torch.compile, and on the GPU torch.compile reduce-overhead), then the side-by-side report.
#
#   bash bench/compare.sh [--cpu] [OUTDIR] [-- kiln_bench args...]
#
#   --cpu           the CPU side instead of the GPU's: kiln_bench's CPU rows (1 and N threads) and
#                   bench/anchors/torch_anchor.py --device cpu with OMP_NUM_THREADS 1 and N (eager
#                   and torch.compile, Inductor's C++ codegen); report by bench/cpu_report.py.
#                   torch is installed if missing: PyPI's wheel into build/torch-venv (CPU use only)
#   OUTDIR          default bench/results/compare_YYYY-MM-DD (compare_cpu_YYYY-MM-DD with --cpu); gets
#                   kiln.json, kiln.txt, torch*.json, torch*.txt, report.md (and report.svg on the GPU)
#   -- ARGS         passed to kiln_bench (after --no-cpu or --no-gpu, --json OUTDIR/kiln.json); a
#                   --filter among them is passed to the anchor too
#   KILN_BENCH      the kiln_bench binary (default build/release/bench/kiln_bench); when it is not
#                   executable, bench/run.sh builds it (Release) and runs it
#   ANCHOR_ARGS     extra arguments for bench/anchors/torch_anchor.py (e.g. "--quick")
#   PYTHON          the Python that has torch (default python3; with --cpu, else build/torch-venv's)
#   THREADS         --cpu: the larger thread count (default: the CPU count)
#
# Either side may fail: the report is still written from what there is, and the exit status is
# non-zero.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=""
CPU=0
KILN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; KILN_ARGS=("$@"); break ;;
    --cpu) CPU=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) if [ -z "$OUT" ]; then OUT="$1"; shift; else echo "compare.sh: unexpected argument $1 (kiln_bench args go after --)" >&2; exit 2; fi ;;
  esac
done
if [ "$CPU" = 1 ]; then OUT="${OUT:-bench/results/compare_cpu_$(date +%F)}"; else OUT="${OUT:-bench/results/compare_$(date +%F)}"; fi
PYTHON="${PYTHON:-python3}"
KILN_BENCH="${KILN_BENCH:-build/release/bench/kiln_bench}"
mkdir -p "$OUT"

# a --filter for kiln_bench filters the anchor's workloads too
ANCHOR=()
for ((i = 0; i < ${#KILN_ARGS[@]}; i++)); do
  if [ "${KILN_ARGS[$i]}" = "--filter" ] && [ $((i + 1)) -lt ${#KILN_ARGS[@]} ]; then
    ANCHOR+=(--filter "${KILN_ARGS[$((i + 1))]}")
  fi
done
# shellcheck disable=SC2206
ANCHOR+=(${ANCHOR_ARGS:-})

# kiln_bench's rows: "$@" after the side's own flags
run_kiln() {
  rm -f "$OUT/kiln.json"
  if [ -x "$KILN_BENCH" ]; then
    # the real model of the minilm_32x64 row, as bench/run.sh fetches it (both sides read it)
    if [ -z "${KILN_MINILM_DIR:-}" ]; then
      bash tests/fetch_minilm.sh build/release/minilm >/dev/null 2>&1 || true
      [ -f build/release/minilm/model/model.safetensors ] && export KILN_MINILM_DIR="$PWD/build/release/minilm/model"
    fi
    "$KILN_BENCH" "$@" --json "$OUT/kiln.json" "${KILN_ARGS[@]}" 2>&1 | tee "$OUT/kiln.txt"
  else
    echo "($KILN_BENCH not found: building it with bench/run.sh)"
    bash bench/run.sh "$@" --json "$OUT/kiln.json" "${KILN_ARGS[@]}" 2>&1 | tee "$OUT/kiln.txt"
  fi
  return "${PIPESTATUS[0]}"
}

status=0
if [ "$CPU" = 1 ]; then
  # torch for the CPU: PYTHON if it has it, else build/torch-venv (made here, PyPI's wheel)
  if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    VENV=build/torch-venv
    if ! "$VENV/bin/python" -c "import torch, transformers" >/dev/null 2>&1; then
      echo "== torch is missing from $PYTHON: installing PyPI's torch (and transformers, for minilm_32x64) into $VENV"
      { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } && "$VENV/bin/python" -m pip install -q torch numpy transformers ||
        { echo "compare.sh: could not install torch; run: python3 -m venv $VENV && $VENV/bin/python -m pip install torch numpy transformers" >&2; status=1; }
    fi
    PYTHON="$VENV/bin/python"
  fi
  N="${THREADS:-$(nproc)}"
  echo "== kiln_bench (CPU rows, 1 and $N threads) -> $OUT/kiln.json"
  run_kiln --no-gpu --threads "$N"
  rc=$?
  [ $rc -eq 0 ] || { echo "compare.sh: kiln_bench failed (exit $rc); the report will lack kiln's rows" >&2; status=1; }
  tfiles=()
  for t in $(printf '%s\n' 1 "$N" | sort -un); do
    echo "== PyTorch anchor on the CPU, OMP_NUM_THREADS=$t -> $OUT/torch_t$t.json"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$t "$PYTHON" bench/anchors/torch_anchor.py --device cpu --methods eager,compile --no-rates --json "$OUT/torch_t$t.json" \
      "${ANCHOR[@]}" 2>&1 | tee "$OUT/torch_t$t.txt"
    rc=${PIPESTATUS[0]}
    [ $rc -eq 0 ] || { echo "compare.sh: torch_anchor exit $rc at $t threads (a failed or mismatching row, or no torch); see $OUT/torch_t$t.txt" >&2; status=1; }
    tfiles+=("$OUT/torch_t$t.json")
  done
  echo "== report -> $OUT/report.md"
  cmd="bash bench/compare.sh --cpu $OUT"
  [ ${#KILN_ARGS[@]} -gt 0 ] && cmd+=" -- ${KILN_ARGS[*]}"
  python3 bench/cpu_report.py --kiln "$OUT/kiln.json" --torch "${tfiles[@]}" --out "$OUT/report.md" --command "$cmd" || status=1
  exit $status
fi

echo "== kiln_bench (GPU rows) -> $OUT/kiln.json"
run_kiln --no-cpu
rc=$?
[ $rc -eq 0 ] || { echo "compare.sh: kiln_bench failed (exit $rc); the report will lack kiln's rows" >&2; status=1; }

echo "== PyTorch anchor -> $OUT/torch.json"
"$PYTHON" bench/anchors/torch_anchor.py --json "$OUT/torch.json" "${ANCHOR[@]}" 2>&1 | tee "$OUT/torch.txt"
rc=$?
[ $rc -eq 0 ] || { echo "compare.sh: torch_anchor exit $rc (a failed or mismatching row, or no torch); see $OUT/torch.txt" >&2; status=1; }

echo "== report -> $OUT"
cmd="bash bench/compare.sh $OUT"
[ ${#KILN_ARGS[@]} -gt 0 ] && cmd+=" -- ${KILN_ARGS[*]}"
[ -n "${ANCHOR_ARGS:-}" ] && cmd="ANCHOR_ARGS='${ANCHOR_ARGS}' $cmd"
"$PYTHON" bench/report.py --kiln "$OUT/kiln.json" --torch "$OUT/torch.json" --out "$OUT" --command "$cmd" || status=1

echo
echo "report: $OUT/report.md (plot: $OUT/report.svg)"
exit $status
