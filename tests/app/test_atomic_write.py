"""Atomic writes: the folder is synced after the rename, F_FULLFSYNC on macOS, temporary files
left by a kill are removed at start, and a real SIGKILL never leaves a partial file."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

from app.app_dirs import atomic_write_text, remove_stale_temp_files
from app.conversations import HistoryStore
from app.settings import load_settings, settings_path

REPO = Path(__file__).resolve().parents[2]


def _same_file(fd: int, path: Path) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_the_folder_is_synced_after_the_rename(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "chat.json"
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-folder" if _same_file(fd, target.parent) else "fsync-file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(sys, "platform", "linux")
    atomic_write_text(target, "new")
    assert events == ["fsync-file", "replace", "fsync-folder"]
    assert target.read_text() == "new"


def test_macos_uses_full_fsync_and_falls_back_to_fsync(tmp_path, monkeypatch):
    calls = []
    fake_fcntl = types.SimpleNamespace(F_FULLFSYNC=51)

    def fcntl_call(fd, op):
        calls.append(("fcntl", op))
        if fake_fcntl.refuse:
            raise OSError("not supported")

    fake_fcntl.fcntl = fcntl_call
    fake_fcntl.refuse = False
    monkeypatch.setitem(sys.modules, "fcntl", fake_fcntl)
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", None)))
    atomic_write_text(tmp_path / "a.json", "x")
    assert calls == [("fcntl", 51), ("fcntl", 51)]  # the file, then its folder
    calls.clear()
    fake_fcntl.refuse = True
    atomic_write_text(tmp_path / "a.json", "y")
    assert calls == [("fcntl", 51), ("fsync", None)] * 2
    assert (tmp_path / "a.json").read_text() == "y"


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_stale_temp_files_are_removed_at_start(app_dirs):
    store = HistoryStore()
    store.folder.mkdir(parents=True)
    config = settings_path().parent
    config.mkdir(parents=True)
    stale = [
        store.folder / ".0123abcd.json.k3j4h5_6.tmp",
        config / ".settings.json.abcdefgh.tmp",
    ]
    fresh = store.folder / ".fedc.json.zz99zz99.tmp"  # another instance writing right now
    unrelated = [store.folder / ".hidden", config / "notes.tmp", store.folder / ".x.short.tmp"]
    for path in [*stale, fresh, *unrelated]:
        path.write_text("partial")
    for path in [*stale, *unrelated]:
        _age(path, 3600)
    store.load_all()
    load_settings()
    assert not any(p.exists() for p in stale)
    assert fresh.exists() and all(p.exists() for p in unrelated)
    assert remove_stale_temp_files(store.folder, older_than_s=0) == [fresh]


# ----- a real kill ---------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from app.conversations import Conversation, HistoryStore, Message
    from app.settings import AppSettings, save_settings

    store = HistoryStore()
    ids = sys.argv[1].split(",")
    n = int(sys.argv[2])
    print("ready", flush=True)
    while True:
        n += 1
        for cid in ids:
            c = Conversation(id=cid, title=f"v{n}")
            c.messages = [Message("user", f"{cid}:{n}:{i}:" + "x" * 2000) for i in range(60)]
            store.save(c)
        save_settings(AppSettings(default_system_prompt=f"v{n}:" + "y" * 50_000))
    """
)


def _version_of_conversation(path: Path) -> int:
    """The version a complete chat file holds; AssertionError when the file is partial."""
    data = json.loads(path.read_text())  # a partial file is not valid JSON
    n = int(data["title"][1:])
    cid = path.stem
    expected = [f"{cid}:{n}:{i}:" + "x" * 2000 for i in range(60)]
    assert [m["content"] for m in data["messages"]] == expected
    return n


def _version_of_settings(path: Path) -> int:
    prompt = json.loads(path.read_text())["default_system_prompt"]
    n, _, rest = prompt.partition(":")
    assert rest == "y" * 50_000
    return int(n[1:])


def test_sigkill_at_random_points_leaves_only_old_or_new_versions(app_dirs):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    ids = ["chat-a", "chat-b", "chat-c"]
    rng = random.Random(12)
    store = HistoryStore()
    seen = {cid: 0 for cid in ids}
    kills = 20
    for _ in range(kills):
        start = max(seen.values())
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, ",".join(ids), str(start)],
            env=env,
            stdout=subprocess.PIPE,
            cwd=str(REPO),
        )
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.01, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
        for cid in ids:
            path = store.path_for(cid)
            if path.exists():
                version = _version_of_conversation(path)
                assert version >= seen[cid]  # never older than what was there before
                seen[cid] = version
        if settings_path().exists():
            _version_of_settings(settings_path())
    assert max(seen.values()) > 0  # the writer did write
    print(f"versions {seen}")
    leftovers = list(store.folder.glob(".*.tmp")) + list(settings_path().parent.glob(".*.tmp"))
    print(f"temp files left by kills: {len(leftovers)}")
    for path in leftovers:
        _age(path, 3600)
    assert sorted(c.id for c in store.load_all()) == sorted(c for c in ids if seen[c] > 0)
    assert store.skipped == []
    settings, message = load_settings()
    assert message is None
    assert not list(store.folder.glob(".*.tmp")) and not list(settings_path().parent.glob(".*.tmp"))
