#!/usr/bin/env bash
# Sign, notarize and staple "dist/A2ATS Chat.app" (macOS only), then zip it for distribution.
# Nothing secret lives in the repository: identities come from the environment.
#
#   A2ATS_CODESIGN_IDENTITY  required: "Developer ID Application: Your Name (TEAMID)"
#                            (see `security find-identity -v -p codesigning`)
#   A2ATS_NOTARY_PROFILE     a keychain profile made once with
#                            `xcrun notarytool store-credentials PROFILE --apple-id ... --team-id ...`
#   or A2ATS_APPLE_ID + A2ATS_TEAM_ID + A2ATS_APP_PASSWORD (an app-specific password)
#   A2ATS_SKIP_NOTARIZE=1    sign and verify only
#
# The bundle is rebuilt from scratch with the identity: PyInstaller then signs every binary
# inside-out with the hardened runtime and packaging/entitlements.plist, and the bundle last.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
APP="dist/A2ATS Chat.app"

fail() { echo "sign_notarize: $*" >&2; exit 1; }
[ "$(uname)" = "Darwin" ] || fail "runs on macOS only"
[ -n "${A2ATS_CODESIGN_IDENTITY:-}" ] || fail "set A2ATS_CODESIGN_IDENTITY (a Developer ID Application identity)"
security find-identity -v -p codesigning | grep -qF "$A2ATS_CODESIGN_IDENTITY" \
  || fail "identity not in the keychain: $A2ATS_CODESIGN_IDENTITY"

notary_auth=()
if [ "${A2ATS_SKIP_NOTARIZE:-0}" != "1" ]; then
  if [ -n "${A2ATS_NOTARY_PROFILE:-}" ]; then
    notary_auth=(--keychain-profile "$A2ATS_NOTARY_PROFILE")
  elif [ -n "${A2ATS_APPLE_ID:-}" ] && [ -n "${A2ATS_TEAM_ID:-}" ] && [ -n "${A2ATS_APP_PASSWORD:-}" ]; then
    notary_auth=(--apple-id "$A2ATS_APPLE_ID" --team-id "$A2ATS_TEAM_ID" --password "$A2ATS_APP_PASSWORD")
  else
    fail "set A2ATS_NOTARY_PROFILE, or A2ATS_APPLE_ID + A2ATS_TEAM_ID + A2ATS_APP_PASSWORD, or A2ATS_SKIP_NOTARIZE=1"
  fi
fi

# 1. Build signed (the spec reads A2ATS_CODESIGN_IDENTITY; a clean build re-signs everything).
PACKAGE_CLEAN=1 PYINSTALLER_STRICT_BUNDLE_CODESIGN_ERROR=1 PYTHON="$PYTHON" packaging/build.sh

# 2. Verify the signature and that the bundle still runs.
codesign --verify --deep --strict --verbose=2 "$APP"
codesign --display --verbose=2 "$APP" 2>&1 | grep -E "Authority|TeamIdentifier|flags" || true
packaging/smoke_test.sh --model tiny

version=$("$PYTHON" -c "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
zip="dist/A2ATS-Chat-$version-macos-$(uname -m).zip"
if [ "${A2ATS_SKIP_NOTARIZE:-0}" = "1" ]; then
  ditto -c -k --sequesterRsrc --keepParent "$APP" "$zip"
  echo "signed (not notarized): $zip"
  exit 0
fi

# 3. Notarize (Apple scans the upload), staple the ticket to the app, zip the stapled app.
ditto -c -k --sequesterRsrc --keepParent "$APP" "$zip"
xcrun notarytool submit "$zip" "${notary_auth[@]}" --wait
xcrun stapler staple "$APP"
xcrun stapler validate "$APP"
spctl --assess --type execute --verbose=2 "$APP"
rm -f "$zip"
ditto -c -k --sequesterRsrc --keepParent "$APP" "$zip"
echo "signed, notarized and stapled: $zip"
