"""Scripted mode (`a2ats-chat --model ... --prompt ... --screenshot ... --quit`), end to end in a
subprocess on the tiny model with QT_QPA_PLATFORM=offscreen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from demo_gate import require_demo
from PySide6.QtGui import QImage

from a2ats_engine.records import SamplingSettings
from app.settings import AppSettings, save_settings


def run_app(args, app_dirs, timeout=300):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env.update(
        A2ATS_CONFIG_DIR=str(app_dirs["config"]),
        A2ATS_DATA_DIR=str(app_dirs["data"]),
        A2ATS_CACHE_DIR=str(app_dirs["cache"]),
    )
    return subprocess.run(
        [sys.executable, "-m", "app.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _files(app_dirs) -> dict[str, int]:
    """Every file under the config and data folders, with its modification time."""
    return {
        str(path): path.stat().st_mtime_ns
        for key in ("config", "data")
        for path in app_dirs[key].rglob("*")
        if path.is_file() and path.name != ".instance.lock"  # the one-writer lock, empty
    }


def test_scripted_mode_writes_a_screenshot(app_dirs, tiny_folder, tmp_path):
    save_settings(AppSettings(), app_dirs["config"] / "settings.json")
    before = _files(app_dirs)
    shot = tmp_path / "shots" / "chat.png"
    result = run_app(
        ["--model", str(tiny_folder), "--prompt", "Hello there", "--screenshot", str(shot),
         "--quit", "--width", "1200", "--height", "800", "--theme", "light"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"screenshot: {shot}" in result.stdout and "reply: " in result.stdout
    image = QImage(str(shot))
    assert not image.isNull() and image.width() >= 1000 and image.height() >= 700
    # A real window, not a blank grab: many distinct colours.
    colours = {
        image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)
    }
    assert len(colours) > 20
    # A temporary chat: no chat saved, the settings (window size included) untouched.
    assert _files(app_dirs) == before
    assert not list(app_dirs["data"].rglob("conversations/*.json"))


def test_scripted_mode_keeps_the_chat_when_asked(app_dirs, tiny_folder, tmp_path):
    result = run_app(["--model", str(tiny_folder), "--prompt", "Hello there", "--quit",
                      "--keep-chat"], app_dirs)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The exchange was saved with provenance.
    (saved,) = (app_dirs["data"] / "conversations").glob("*.json")
    messages = json.loads(saved.read_text())["messages"]
    assert messages[0]["content"] == "Hello there"
    assert messages[1]["provenance"]["model"]["path"] == str(tiny_folder)


def test_scripted_mode_exports_inspector_telemetry(app_dirs, tiny_folder, tmp_path):
    out = tmp_path / "telemetry.json"
    result = run_app(
        ["--model", str(tiny_folder), "--prompt", "Hello", "--export-telemetry", str(out),
         "--quit"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())  # the inspector's format; its own tests check the rest
    assert data["steps"] and data["meta"]["prompt"] == "Hello"


def test_scripted_mode_fails_cleanly_on_a_bad_model(app_dirs, tmp_path):
    missing = tmp_path / "no-model-here"
    result = run_app(
        ["--model", str(missing), "--prompt", "hi", "--screenshot", str(tmp_path / "x.png"), "--quit"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("a2ats-chat: ")
    assert "no-model-here" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_scripted_mode_fails_cleanly_on_a_bad_hosts_file(app_dirs, tiny_folder, tmp_path):
    hosts = tmp_path / "my-hosts.json"
    hosts.write_text("[]")
    result = run_app(
        ["--model", str(tiny_folder), "--hosts", str(hosts), "--prompt", "hi", "--screenshot",
         str(tmp_path / "x.png"), "--quit"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 1
    assert "my-hosts.json" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x.png").exists()


def test_scripted_mode_on_two_local_ranks(two_ranks, app_dirs, tiny_folder, tmp_path):
    from tests.two_ranks import local_hosts

    shot = tmp_path / "ranks.png"
    telemetry = tmp_path / "ranks.json"
    result = run_app(
        ["--model", str(tiny_folder), "--hosts", str(local_hosts(tmp_path)), "--prompt",
         "Hello ranks", "--screenshot", str(shot), "--export-telemetry", str(telemetry),
         "--quit"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "reply: " in result.stdout and not QImage(str(shot)).isNull()
    steps = json.loads(telemetry.read_text())["steps"]
    assert steps and {layer["layer"] for layer in steps[-1]["layers"]} == {0, 1}  # both ranks'


def test_scripted_mode_fails_cleanly_on_a_bad_codebook(app_dirs, tiny_folder, tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"junk")
    result = run_app(
        ["--model", str(tiny_folder), "--codebook", str(junk), "--prompt", "hi",
         "--screenshot", str(tmp_path / "x.png"), "--quit"],
        app_dirs,
    )  # fmt: skip
    assert result.returncode == 1
    assert "a2ats-chat: " in result.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.demo
def test_scripted_mode_on_the_demo_model_with_its_default_codebook(tmp_path):
    from a2ats_engine.calibration.calibrate import demo_codebook_path

    real_data = require_demo().parents[1]  # <data dir>/models/<name>
    dirs = {name: tmp_path / name for name in ("config", "data", "cache")}
    dirs["data"].mkdir()
    (dirs["data"] / "models").symlink_to(real_data / "models")
    has_codebook = demo_codebook_path().exists()
    if has_codebook:
        (dirs["data"] / "codebooks").symlink_to(demo_codebook_path().parent)
    settings = AppSettings(sampling=SamplingSettings(temperature=0.0, max_tokens=48))
    save_settings(settings, dirs["config"] / "settings.json")
    shot = tmp_path / "demo.png"
    result = run_app(
        ["--model", "demo", "--prompt", "What is the capital of France?", "--screenshot",
         str(shot), "--quit", "--keep-chat"],
        dirs, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert shot.exists()
    (saved,) = (dirs["data"] / "conversations").glob("*.json")
    reply = json.loads(saved.read_text())["messages"][1]
    assert "Paris" in reply["content"]
    codebook = reply["provenance"]["codebook"]
    if has_codebook:
        assert codebook["name"] == "demo-default.safetensors" and len(codebook["sha256"]) == 64


def test_scripted_mode_over_a_surrogate_chat_and_huge_splitter_sizes(
    app_dirs, tiny_folder, tmp_path
):
    chats = app_dirs["data"] / "conversations"
    chats.mkdir(parents=True)
    (chats / "abc.json").write_text(
        '{"title":"t\\udc80","messages":[{"role":"user","content":"hi \\ud800"}],"draft":"unsent"}'
    )
    app_dirs["config"].mkdir(parents=True)
    (app_dirs["config"] / "settings.json").write_text('{"splitter_sizes": [99999999999, 5]}')
    argv = ["--model", str(tiny_folder), "--prompt", "Hello", "--keep-chat", "--quit"]
    result = run_app(argv, app_dirs)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "reply: " in result.stdout
    assert list(app_dirs["config"].glob("settings.json.corrupt-*"))
    assert json.loads((app_dirs["config"] / "settings.json").read_text())  # saved on quit


def test_scripted_mode_refuses_a_data_folder_another_instance_writes(app_dirs, tiny_folder):
    from app.instance_lock import InstanceLock

    lock = InstanceLock(app_dirs["data"] / "conversations")
    assert lock.acquire()  # "another instance" (this process) holds the folder
    try:
        result = run_app(["--model", str(tiny_folder), "--prompt", "Hello", "--quit"], app_dirs)
    finally:
        lock.release()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("a2ats-chat: Another A2ATS Chat")
    assert not list((app_dirs["data"] / "conversations").glob("*.json"))


def test_scripted_mode_prints_the_progress_of_a_long_prefill(app_dirs, tiny_folder):
    # About 2,600 prompt tokens: two prefill chunks of the session's 2,048.
    result = run_app(["--model", str(tiny_folder), "--prompt", "word " * 1300, "--quit"],
                     app_dirs)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Reading the prompt")]
    # Before the first chunk, after it, and after the second (mlx-lm keeps the prompt's last
    # token for the first decode step).
    assert len(lines) == 3, result.stderr
    assert lines[0].startswith("Reading the prompt: 0 / ") and "left" not in lines[0]
    assert lines[1].startswith("Reading the prompt: 2,048 / ") and lines[1].endswith(" left")
    assert all(line.endswith(" left") for line in lines[1:])
    # Engine warnings are one-line notes, as on the command line.
    assert "UserWarning" not in result.stderr
