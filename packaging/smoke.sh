#!/usr/bin/env bash
# Smoke test of a built bundle (not part of `make test`: building takes minutes). Runs the bundle's --version,
# one CLI command, and a headless --screenshot, and checks the PNG is a non-empty image.
# Usage: bash packaging/smoke.sh [path/to/vramscope executable]   (default: dist/vramscope/vramscope)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXE="${1:-$ROOT/dist/vramscope/vramscope}"
[[ -x "$EXE" ]] || EXE="$EXE.exe"
[[ -x "$EXE" ]] || { echo "error: no built bundle at ${1:-dist/vramscope/vramscope}; run bash packaging/build.sh first" >&2; exit 2; }
TMP="$(mktemp -d "${TMPDIR:-/tmp}/vramscope-smoke.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export QT_QPA_PLATFORM=offscreen
fail() { echo "FAIL: $*" >&2; exit 1; }

version="$("$EXE" --version)" || fail "--version exited $?"
[[ "$version" == VRAMScope\ * ]] || fail "--version printed '$version'"
echo "ok  --version: $version"

# The bundled resources (GPU catalogue) and the engine, without Qt.
"$EXE" estimate --help >/dev/null || fail "estimate --help exited $?"
echo "ok  estimate --help"

SHOT="${SMOKE_SHOT:-$TMP/shot.png}"
start=$(date +%s)
set +e
"$EXE" --screenshot "$SHOT" 2>"$TMP/shot.err"
rc=$?
set -e
secs=$(( $(date +%s) - start ))
[[ $rc -eq 0 ]] || { cat "$TMP/shot.err" >&2; fail "--screenshot exited $rc"; }
# A warning means the window was grabbed without an estimate (the engine failed or timed out).
if grep -q '^warning:' "$TMP/shot.err"; then cat "$TMP/shot.err" >&2; fail "--screenshot ran without an estimate"; fi
[[ -s "$SHOT" ]] || fail "--screenshot wrote no file"
head -c 8 "$SHOT" | od -An -tx1 | tr -d ' \n' | grep -q '^89504e470d0a1a0a$' || fail "$SHOT is not a PNG"
echo "ok  --screenshot: $(wc -c <"$SHOT") bytes in ${secs} s${SMOKE_SHOT:+ -> $SHOT}"
echo "smoke test passed"
