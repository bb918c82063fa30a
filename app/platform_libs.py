"""The system libraries Qt's xcb platform plugin (a window on an X11 desktop) cannot find.

PySide6's wheel carries Qt but not the X11 / xcb libraries its `libqxcb.so` links; on a bare
Linux desktop Qt then aborts with "Could not load the Qt platform plugin "xcb"". `ldd` on the
plugin (and on Qt's XcbQpa library it loads) names what is missing; `make sysdeps` installs the
Debian packages below. Qt-free: runs before any QApplication exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# Shared library -> Debian package, for every library the xcb plugin links beyond glibc / GL.
XCB_PACKAGES = {
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}


def xcb_plugin_files() -> list[Path]:
    """PySide6's `plugins/platforms/libqxcb.so` and `lib/libQt6XcbQpa.so.6` that exist."""
    import importlib.util

    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return []
    qt = Path(next(iter(spec.submodule_search_locations))) / "Qt"
    candidates = (qt / "plugins" / "platforms" / "libqxcb.so", qt / "lib" / "libQt6XcbQpa.so.6")
    return [path for path in candidates if path.is_file()]


def missing_libraries(files: list[Path]) -> list[str]:
    """Shared libraries `ldd` reports as "not found" for any of `files` (sorted, unique)."""
    ldd = shutil.which("ldd")
    if ldd is None or not files:
        return []
    missing: set[str] = set()
    for path in files:
        done = subprocess.run(
            [ldd, str(path)], capture_output=True, text=True, timeout=30, check=False
        )
        for line in done.stdout.splitlines():
            name, _, where = line.strip().partition("=>")
            if where.strip() == "not found":
                missing.add(name.strip())
    return sorted(missing)


def missing_xcb_libraries() -> list[str]:
    """What Qt's xcb plugin links but the system lacks; [] off Linux or without PySide6."""
    if not sys.platform.startswith("linux"):
        return []
    return missing_libraries(xcb_plugin_files())


def missing_xcb_note(missing: list[str]) -> str:
    """One line a user can act on: the packages to install."""
    packages = sorted({XCB_PACKAGES.get(name, name) for name in missing})
    return (
        f"Qt's xcb platform plugin needs {', '.join(missing)}: install them with "
        f"`sudo apt-get install {' '.join(packages)}` (or `make sysdeps` as root), "
        "or run headless with QT_QPA_PLATFORM=offscreen"
    )


def will_use_xcb() -> bool:
    """True when Qt would open its window through the xcb plugin (Linux X11 session)."""
    if not sys.platform.startswith("linux"):
        return False
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return bool(os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")
