#!/usr/bin/env bash
# kiln vs PyTorch in one session on one GPU: kiln_bench's GPU rows, the PyTorch anchor (eager,
# torch.compile, torch.compile reduce-overhead), then the side-by-side report.
#
#   bash bench/compare.sh [OUTDIR] [-- kiln_bench args...]
#
#   OUTDIR          default bench/results/compare_YYYY-MM-DD; gets kiln.json, kiln.txt, torch.json,
#                   torch.txt, report.md, report.svg
#   -- ARGS         passed to kiln_bench (after --no-cpu --json OUTDIR/kiln.json); a --filter among
#                   them is passed to the anchor too
#   KILN_BENCH      the kiln_bench binary (default build/release/bench/kiln_bench); when it is not
#                   executable, bench/run.sh builds it (Release) and runs it
#   ANCHOR_ARGS     extra arguments for bench/anchors/torch_anchor.py (e.g. "--quick")
#   PYTHON          the Python that has torch (default python3)
#
# Either side may fail: the report is still written from what there is, and the exit status is
# non-zero.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=""
KILN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; KILN_ARGS=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) if [ -z "$OUT" ]; then OUT="$1"; shift; else echo "compare.sh: unexpected argument $1 (kiln_bench args go after --)" >&2; exit 2; fi ;;
  esac
done
OUT="${OUT:-bench/results/compare_$(date +%F)}"
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

status=0
echo "== kiln_bench (GPU rows) -> $OUT/kiln.json"
rm -f "$OUT/kiln.json"
if [ -x "$KILN_BENCH" ]; then
  "$KILN_BENCH" --no-cpu --json "$OUT/kiln.json" "${KILN_ARGS[@]}" 2>&1 | tee "$OUT/kiln.txt"
else
  echo "($KILN_BENCH not found: building it with bench/run.sh)"
  bash bench/run.sh --no-cpu --json "$OUT/kiln.json" "${KILN_ARGS[@]}" 2>&1 | tee "$OUT/kiln.txt"
fi
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
