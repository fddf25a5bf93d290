#!/usr/bin/env bash
# Puts scikit-learn's handwritten digits (1797 8x8 images, the file sklearn/datasets/data/digits.csv.gz
# that ships inside the scikit-learn package) at DEST/digits.csv, for examples/train_digits.cpp:
# from an installed scikit-learn, else from its wheel fetched with pip (not installed). Nothing is
# downloaded at run time by the example itself.
#   bash tests/fetch_digits.sh DEST
# Already there: nothing to do. No scikit-learn and no network: says why and exits 0, and the
# example reports itself skipped (exit 77), never passed.
set -uo pipefail
DEST="${1:?usage: fetch_digits.sh DEST}"
[ -f "$DEST/digits.csv" ] && { echo "fetch_digits: $DEST/digits.csv already there"; exit 0; }
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch_digits: SKIPPED: no python3 (the digits example will be skipped)"; exit 0; }
mkdir -p "$DEST"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
SRC="$("$PY" -c 'import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz"))' 2>/dev/null)"
if [ -z "$SRC" ] || [ ! -f "$SRC" ]; then
  if ! timeout 600 "$PY" -m pip download scikit-learn --no-deps --only-binary=:all: -d "$TMP" > "$TMP/pip.log" 2>&1; then
    echo "fetch_digits: SKIPPED: no scikit-learn installed and pip could not download it; last lines:"; tail -3 "$TMP/pip.log"; exit 0
  fi
  SRC="$TMP/wheel"
fi
"$PY" - "$SRC" "$DEST/digits.csv.partial" <<'P' || { echo "fetch_digits: FAILED: could not read the digits"; exit 1; }
import glob, gzip, io, os, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
if src.endswith("wheel"):
    whl = glob.glob(os.path.join(os.path.dirname(src), "scikit_learn-*.whl"))[0]
    with zipfile.ZipFile(whl) as z:
        data = gzip.decompress(z.read("sklearn/datasets/data/digits.csv.gz"))
else:
    data = gzip.decompress(open(src, "rb").read())
rows = [r for r in data.decode().splitlines() if r.strip()]
assert len(rows) == 1797 and all(len(r.split(",")) == 65 for r in rows), "unexpected digits.csv layout"
open(out, "w").write("\n".join(rows) + "\n")
P
mv "$DEST/digits.csv.partial" "$DEST/digits.csv"   # complete or absent, never half there
echo "fetch_digits: scikit-learn's digits at $DEST/digits.csv"
