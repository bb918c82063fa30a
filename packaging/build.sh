#!/usr/bin/env bash
# Build the desktop app with PyInstaller (packaging/a2ats_chat.spec).
#   macOS:  dist/A2ATS Chat.app        Linux/other: dist/a2ats-chat/ (one folder)
# Env: PYTHON (default .venv/bin/python, needs the `package` extra: pip install -e ".[package]"),
#      PACKAGE_CLEAN=1 to discard PyInstaller's analysis cache (build/pyinstaller) first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

if ! "$PYTHON" -c "import PyInstaller" 2>/dev/null; then
  echo "PyInstaller is not installed for $PYTHON: run 'make package' or pip install -e '.[package]'" >&2
  exit 1
fi

# The .icns is committed; re-render it only when the SVG changed after it.
if [ ! -f resources/app.icns ] || [ resources/icons/app.svg -nt resources/app.icns ]; then
  QT_QPA_PLATFORM=offscreen "$PYTHON" packaging/make_icns.py resources/icons/app.svg resources/app.icns
fi

clean=()
if [ "${PACKAGE_CLEAN:-0}" = "1" ]; then clean=(--clean); fi
start=$(date +%s)
"$PYTHON" -m PyInstaller --noconfirm --log-level WARN ${clean[@]+"${clean[@]}"} \
  --distpath dist --workpath build/pyinstaller packaging/a2ats_chat.spec
if [ "$(uname)" = "Darwin" ]; then out="dist/A2ATS Chat.app"; else out="dist/a2ats-chat"; fi
echo "built $out ($(du -sh "$out" | cut -f1)) in $(( $(date +%s) - start )) s"
