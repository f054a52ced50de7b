#!/usr/bin/env bash
# Build the one-folder desktop bundle dist/vramscope/ (PyInstaller, packaging/vramscope.spec); prints its size
# and the build time. Run from anywhere; uses .venv/bin/python when present, else $PYTHON or python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
elif [[ -x .venv/Scripts/python.exe ]]; then PY=.venv/Scripts/python.exe
else PY=python3
fi
"$PY" -c "import PyInstaller" 2>/dev/null || { echo "error: PyInstaller is missing; run: $PY -m pip install -e '.[package]'" >&2; exit 2; }

start=$(date +%s)
"$PY" -m PyInstaller --noconfirm --clean --log-level "${PYI_LOG_LEVEL:-WARN}" \
    --distpath "$ROOT/dist" --workpath "$ROOT/build" packaging/vramscope.spec
end=$(date +%s)

secs=$((end - start))
echo "built dist/vramscope in $((secs / 60)) min $((secs % 60)) s"
du -sh dist/vramscope | awk '{print "bundle size: " $1 " (dist/vramscope)"}'
for part in torch PySide6; do
    for d in dist/vramscope/_internal/$part dist/vramscope/$part; do
        [[ -d "$d" ]] && du -sh "$d" | awk -v p="$part" '{print "  of which " p ": " $1}' && break
    done
done
[[ -d dist/VRAMScope.app ]] && du -sh dist/VRAMScope.app | awk '{print "macOS app: " $1 " (dist/VRAMScope.app)"}'
exit 0
