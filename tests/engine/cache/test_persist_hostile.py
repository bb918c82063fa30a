"""load_session on damaged or crafted session files: one A2ATSError line naming the file, and
nothing sized from the file's metadata before it is checked (cache/persist.py)."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import pytest
from tiny import made_for, tiny_model

from a2ats_engine import load_session, save_session
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.errors import A2ATSError

from ..bounded import run_capped


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    model = tiny_model("llama")
    book = made_for(model, Codebook.random(2, 2, 16, 32))
    cache = make_cache(model, A2ATSConfig(window=16, sinks=4, budget=8), book)
    model(mx.array([list(range(3, 60))]), cache=cache)
    path = tmp_path_factory.mktemp("sess") / "good.safetensors"
    save_session(path, cache, {"title": "t"})
    return path


def _rewrite(src, dst, change) -> None:
    arrays, meta = mx.load(str(src), return_metadata=True)
    data = json.loads(meta["a2ats-session"])
    data = change(data)
    mx.save_safetensors(str(dst), arrays, metadata={"a2ats-session": json.dumps(data)})


def _set_rope(data, **fields):
    for entry in data["layers"]:
        rope = json.loads(entry["meta_state"][2])
        rope.update(fields)
        entry["meta_state"][2] = json.dumps(rope)
    return data


def _set(path: list, value):
    def change(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return data

    return change


CASES = {
    "not an object": lambda d: [d],
    "layers not a list": _set(["layers"], "x"),
    "a layer not an object": _set(["layers", 0], 7),
    "n_arrays missing array": _set(["layers", 0, "n_arrays"], 9),
    "n_arrays negative": _set(["layers", 0, "n_arrays"], -1),
    "unknown kind": _set(["layers", 0, "kind"], "bogus"),
    "meta_state too short": _set(["layers", 0, "meta_state"], ["0"]),
    "meta_state not strings": _set(["layers", 0, "meta_state"], [0, 1, 2, 3, 4, 5]),
    "config not JSON": _set(["layers", 0, "meta_state", 1], "{"),
    "rope not JSON": _set(["layers", 0, "meta_state", 2], "[" * 50_000),
    "layer index out of range": _set(["layers", 0, "meta_state", 0], "99"),
    "max_context huge": _set(["layers", 0, "meta_state", 3], str(1 << 60)),
    "codebook layers wrong": _set(["codebook", "num_layers"], "two"),
    "codebook metadata wrong": _set(["codebook", "metadata"], 5),
    "rope dims odd": lambda d: _set_rope(d, dims=3),
    "rope unknown field": lambda d: _set_rope(d, bogus=1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_session_metadata_is_one_error_naming_the_file(session, tmp_path, case):
    bad = tmp_path / "bad.safetensors"
    _rewrite(session, bad, CASES[case])
    with pytest.raises(A2ATSError) as info:
        load_session(bad, tiny_model("llama"))
    message = str(info.value)
    assert message.startswith("bad.safetensors") and "\n" not in message, message


def test_a_huge_rope_head_dim_is_refused_before_anything_is_sized_from_it(session, tmp_path):
    bad = tmp_path / "huge.safetensors"
    _rewrite(session, bad, lambda d: _set_rope(d, head_dim=1 << 40, dims=1 << 40))
    result = run_capped(
        f"""
        from a2ats_engine import load_session
        load_session({str(bad)!r})
        """
    )
    assert result["kind"] == "A2ATSError", result
    assert result["message"].startswith("huge.safetensors") and "head_dim" in result["message"]


def test_a_safetensors_header_longer_than_the_file_is_refused(session, tmp_path):
    data = bytearray(session.read_bytes())
    bad = tmp_path / "long.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + bytes(data[8:]))
    with pytest.raises(A2ATSError, match=r"^long\.safetensors: not an A2ATS session file"):
        load_session(bad)


def test_an_array_past_the_end_of_the_file_is_refused(session, tmp_path):
    data = session.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [1 << 20, 1 << 20]
    blob = json.dumps(header).encode()
    bad = tmp_path / "shape.safetensors"
    bad.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n :])
    with pytest.raises(A2ATSError, match=r"^shape\.safetensors: "):
        load_session(bad)


@pytest.mark.parametrize("code", [32, 65535])  # the session's codebook has 32 centroids
def test_a_code_past_the_codebook_is_refused(session, tmp_path, code):
    """Codes index the step's lookup tables (the C++ step reads them unchecked): a code at or
    past the centroid count is one error naming the file, not a read past the tables."""
    arrays, meta = mx.load(str(session), return_metadata=True)
    n_arrays = json.loads(meta["a2ats-session"])["layers"][0]["n_arrays"]
    key = f"layers.0.{n_arrays - 1}"  # an A2ATS layer's state: rows, then its codes
    codes = arrays[key]
    assert codes.dtype == mx.uint16
    arrays[key] = codes.at[0, 0, 5, 0].add(code - codes[0, 0, 5, 0])
    bad = tmp_path / "codes.safetensors"
    mx.save_safetensors(str(bad), arrays, metadata=meta)
    with pytest.raises(A2ATSError) as info:
        load_session(bad, tiny_model("llama"))
    message = str(info.value)
    assert message.startswith("codes.safetensors") and f"code {code} outside" in message, message
