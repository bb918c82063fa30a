#!/usr/bin/env bash
# Check a built bundle: its layout (MLX library + Metal library together, one libmlx, Qt plugins,
# resources; Info.plist on macOS), then launch the bundled binary with --self-test offscreen in a
# clean environment (no venv, no PYTHONPATH, run from a temporary folder). Exit status: 0 = pass.
# Extra arguments go to the self-test (e.g. --model tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "$(uname)" = "Darwin" ]; then
  APP="$ROOT/dist/A2ATS Chat.app"
  BIN="$APP/Contents/MacOS/a2ats-chat"
  INTERNAL="$APP/Contents/Frameworks"
  LIBMLX=libmlx.dylib
else
  BIN="$ROOT/dist/a2ats-chat/a2ats-chat"
  INTERNAL="$ROOT/dist/a2ats-chat/_internal"
  LIBMLX=libmlx.so
fi
fail() { echo "package-check: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "no bundle at $BIN (run 'make package')"

# Layout ------------------------------------------------------------------------------------
[ -f "$INTERNAL/mlx/lib/$LIBMLX" ] || fail "$LIBMLX is not in mlx/lib"
copies=$(find "$INTERNAL" -name "$LIBMLX" -type f | wc -l | tr -d " ")
[ "$copies" = "1" ] || fail "$copies copies of $LIBMLX in the bundle (MLX must load the one in mlx/lib)"
plugins="$INTERNAL/PySide6/Qt/plugins"
for plugin in platforms/*qoffscreen* iconengines/*qsvgicon* imageformats/*qsvg*; do
  compgen -G "$plugins/$plugin" >/dev/null || fail "Qt plugin $plugin missing under $plugins"
done
[ -f "$INTERNAL/resources/icons/app.svg" ] || fail "resources/ not bundled"
if [ "$(uname)" = "Darwin" ]; then
  # MLX loads mlx.metallib from the folder of the libmlx it was loaded from.
  # Every path libmlx.dylib can be loaded through (the file, PyInstaller's top-level link) needs
  # mlx.metallib beside it.
  while IFS= read -r lib; do
    [ -f "$(dirname "$lib")/mlx.metallib" ] || fail "no mlx.metallib next to $lib"
  done < <(find "$APP/Contents" -name "$LIBMLX")
  plist="$APP/Contents/Info.plist"
  for key in CFBundleIdentifier CFBundleShortVersionString NSHighResolutionCapable \
             LSMinimumSystemVersion CFBundleIconFile; do
    /usr/libexec/PlistBuddy -c "Print :$key" "$plist" >/dev/null 2>&1 || fail "Info.plist lacks $key"
  done
  [ -f "$APP/Contents/Resources/app.icns" ] || fail "app.icns not in Contents/Resources"
fi
echo "package-check: layout ok ($(du -sh "$(dirname "$INTERNAL")" | cut -f1))"

# Launch ------------------------------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
start=$(date +%s)
env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
  ${A2ATS_DATA_DIR:+A2ATS_DATA_DIR="$A2ATS_DATA_DIR"} \
  ${A2ATS_CACHE_DIR:+A2ATS_CACHE_DIR="$A2ATS_CACHE_DIR"} \
  "$BIN" --self-test "$@"
echo "package-check: self-test of the bundle passed in $(( $(date +%s) - start )) s"
