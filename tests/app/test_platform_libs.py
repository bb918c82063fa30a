"""The libraries of Qt's xcb platform plugin (the app's window on an X11 desktop) resolve.

`make sysdeps` installs them; without them `make run` on a bare Linux desktop aborts in Qt."""

from __future__ import annotations

import stat
import sys

import pytest

from app import main as app_main
from app import platform_libs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the xcb plugin is Linux-only")
def test_every_library_of_the_xcb_plugin_resolves():
    files = platform_libs.xcb_plugin_files()
    assert any(path.name == "libqxcb.so" for path in files), files
    missing = platform_libs.missing_libraries(files)
    assert not missing, platform_libs.missing_xcb_note(missing)


def test_missing_libraries_reads_what_ldd_did_not_find(tmp_path, monkeypatch):
    fake = tmp_path / "ldd"
    fake.write_text(
        "#!/bin/sh\n"
        "echo '\tlinux-vdso.so.1 (0x00007ffd)'\n"
        "echo '\tlibxcb-icccm.so.4 => not found'\n"
        "echo '\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f)'\n"
        "echo '\tlibxcb-keysyms.so.1 => not found'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(platform_libs.shutil, "which", lambda name: str(fake))
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    missing = platform_libs.missing_libraries([plugin, plugin])
    assert missing == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    note = platform_libs.missing_xcb_note(missing)
    assert "apt-get install libxcb-icccm4 libxcb-keysyms1" in note and "\n" not in note


def test_the_app_says_which_packages_are_missing_instead_of_aborting(monkeypatch, capsys):
    monkeypatch.setattr(platform_libs, "will_use_xcb", lambda: True)
    monkeypatch.setattr(platform_libs, "missing_xcb_libraries", lambda: ["libxcb-icccm.so.4"])
    assert app_main.main(["--model", "demo"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("a2ats-chat: ") and "libxcb-icccm4" in err


def test_xcb_is_checked_only_when_qt_would_use_it(monkeypatch):
    monkeypatch.setattr(platform_libs.sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert not platform_libs.will_use_xcb()
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert platform_libs.will_use_xcb()
    monkeypatch.delenv("QT_QPA_PLATFORM")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert platform_libs.will_use_xcb()
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert not platform_libs.will_use_xcb()
