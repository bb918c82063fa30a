"""Packaging pieces that run without building a bundle: the .icns writer and `--self-test`.

(`make package-check` builds the real bundle and runs its self-test; it takes minutes, so it is
not part of the test suite.)
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_make_icns():
    spec = importlib.util.spec_from_file_location("make_icns", ROOT / "packaging" / "make_icns.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_icns = _load_make_icns()


def _assert_every_size(blob: bytes) -> None:
    entries = make_icns.read_icns(blob)
    assert [kind for kind, _ in entries] == [kind for kind, _ in make_icns.ICNS_TYPES]
    for (kind, data), (_, size) in zip(entries, make_icns.ICNS_TYPES, strict=True):
        assert make_icns.png_size(data) == (size, size), kind


def test_make_icns_renders_every_size(tmp_path, qapp):
    out = make_icns.make_icns(ROOT / "resources" / "icons" / "app.svg", tmp_path / "app.icns")
    _assert_every_size(out.read_bytes())


def test_icns_pixels_come_from_the_svg(tmp_path, qapp):
    from PySide6.QtGui import QImage

    svg = tmp_path / "red.svg"
    svg.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8">'
        '<rect width="8" height="8" fill="#ff0000"/></svg>'
    )
    png = make_icns.render_png(svg, 64, margin=0.25)
    image = QImage.fromData(png, "PNG")
    centre, corner = image.pixelColor(32, 32), image.pixelColor(2, 2)
    assert (centre.red(), centre.green(), centre.blue(), centre.alpha()) == (255, 0, 0, 255)
    assert corner.alpha() == 0  # the margin stays transparent


def test_committed_icns_is_complete():
    _assert_every_size((ROOT / "resources" / "app.icns").read_bytes())


def test_read_icns_rejects_bad_files():
    good = make_icns.build_icns([(b"ic07", b"x" * 10)])
    assert make_icns.read_icns(good) == [(b"ic07", b"x" * 10)]
    with pytest.raises(ValueError, match="not an icns"):
        make_icns.read_icns(b"PK\x03\x04" + good[4:])
    with pytest.raises(ValueError, match="header says"):
        make_icns.read_icns(good[:-3])
    overlong = b"icns" + struct.pack(">I", 18) + b"ic07" + struct.pack(">I", 4000) + b"xx"
    with pytest.raises(ValueError, match="bad length"):
        make_icns.read_icns(overlong)
    with pytest.raises(ValueError, match="not PNG"):
        make_icns.png_size(b"GIF89a" + b"\0" * 30)


def test_self_test_passes_on_the_tiny_model(qapp, capsys):
    from app.main import main

    assert main(["--self-test", "--model", "tiny", "--tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "self-test passed" in out
    for name in ("qt", "app", "mlx", "models", "tiny"):
        assert f"ok   {name}" in out
    assert " 0 retrieval steps" not in out
    if sys.platform != "darwin":  # the step a CPU-only retrieval takes: in MLX's graph
        assert ", host step C++ in MLX's graph (graph_step.cpp" in out


def test_self_test_fails_when_nothing_is_retrieved(qapp, capsys, monkeypatch):
    from app import selftest

    # A window longer than the conversation: every decode step is exact, so the check must fail.
    monkeypatch.setattr(selftest, "SELFTEST_WINDOW", 4096)
    assert selftest.run("tiny", tokens=4) == 1
    out = capsys.readouterr().out
    assert "FAIL tiny" in out and "no decode step retrieved" in out
    assert "self-test FAILED (tiny)" in out


def test_the_app_self_test_and_the_tests_build_the_same_tiny_model(tmp_path):
    import mlx.core as mx
    from tiny import tiny_model

    from a2ats_engine.loading.models import load_model
    from app.selftest import write_tiny_model

    model, _, info = load_model(write_tiny_model(tmp_path / "tiny", seed=3))
    reference = tiny_model("llama", seed=3)
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (2, 4, 2, 16)
    tokens = mx.array([[1, 2, 3, 4]])
    assert mx.allclose(model(tokens), reference(tokens), atol=1e-5).item()


@pytest.mark.demo
def test_self_test_passes_on_the_demo_model_as_installed():
    """`a2ats-chat --self-test` as a user runs it: the demo model at its shipped settings, whose
    measured crossover is far above the self-test's short chat, must still retrieve."""
    import os
    import subprocess
    import sys

    from demo_gate import require_demo

    require_demo()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, "-m", "app.main", "--self-test"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   demo" in done.stdout and "self-test passed" in done.stdout
    assert " 0 retrieval steps" not in done.stdout


def test_the_app_help_names_the_self_test(capsys):
    from app.main import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--self-test" in capsys.readouterr().out
