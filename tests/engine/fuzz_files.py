"""Hypothesis targets over every file the engine and the CLI read: codebooks, the crossover
table, session files, GGUF headers and metadata. `test_fuzz_files.py` runs each in a child
interpreter whose address space is capped (`bounded.run_capped`), so a reader that sizes an
allocation from a hostile file fails with MemoryError instead of exhausting the machine.

The contract checked for every input: the reader returns, or raises an `A2ATSError` (or
`ValueError`) of one line that names the file; no other exception type.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2ats_engine.errors import A2ATSError

MAX_ABS_VALUE = 1e12  # cache/codebook_file.py: the largest magnitude a loaded codebook may hold

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
WORK = Path(tempfile.mkdtemp(prefix="a2ats-fuzz-"))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def expect_one_line(call, path: Path):
    """Run `call()`; an A2ATSError / ValueError must be one line naming `path`'s file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except (A2ATSError, ValueError) as exc:
        message = str(exc)
        assert path.name in message, f"{type(exc).__name__} does not name the file: {message}"
        assert "\n" not in message, f"more than one line: {message!r}"
        return None


@st.composite
def mutations(draw, size: int):
    """A list of (offset, bytes) overwrites and an optional truncation of a file of `size`."""
    edits = draw(
        st.lists(
            st.tuples(st.integers(0, max(size - 1, 0)), st.binary(min_size=1, max_size=8)),
            max_size=4,
        )
    )
    cut = draw(st.none() | st.integers(0, size))
    return edits, cut


def mutate(data: bytes, edits, cut) -> bytes:
    out = bytearray(data)
    for at, blob in edits:
        out[at : at + len(blob)] = blob
    return bytes(out[:cut] if cut is not None else out)


def _set_json_path(data, path: list[int], value):
    """Replace a node of a JSON document chosen by `path` (indices into dict keys / lists)."""
    node = data
    for step in path:
        if isinstance(node, dict) and node:
            key = sorted(node)[step % len(node)]
            if not isinstance(node[key], dict | list) or not node[key]:
                node[key] = value
                return data
            node = node[key]
        elif isinstance(node, list) and node:
            i = step % len(node)
            if not isinstance(node[i], dict | list) or not node[i]:
                node[i] = value
                return data
            node = node[i]
        else:
            return value
    return data


# -- codebooks ----------------------------------------------------------------------------------


_ARRAYS = {f"layers.{i}.{n}" for i in (0, 1) for n in ("centroids", "assign_centroids", "chol")}


def _codebook_file() -> Path:
    from a2ats_engine.cache.codebook import Codebook

    path = WORK / "base_codebook.safetensors"
    if not path.exists():
        Codebook.random(2, 2, 16, n_centroids=8, seed=0).save(path)
    return path


@SETTINGS
@given(
    change=st.none() | mutations(4096),
    meta_path=st.lists(st.integers(0, 50), max_size=4),
    value=json_values,
    fill=st.none()
    | st.tuples(
        st.sampled_from(sorted(_ARRAYS)),
        st.sampled_from([float("nan"), float("inf"), -float("inf"), 3e30]) | st.floats(width=32),
    ),
)
def fuzz_codebook(change, meta_path, value, fill):
    import mlx.core as mx

    from a2ats_engine.cache.codebook import Codebook

    base = _codebook_file()
    path = WORK / "codebook.safetensors"
    arrays, meta = mx.load(str(base), return_metadata=True)
    if fill is not None:  # one array filled with any float32, NaN and infinities included
        name, number = fill
        arrays[name] = mx.full(arrays[name].shape, number)
    blob = _set_json_path(json.loads(meta["a2ats"]), meta_path, value)
    mx.save_safetensors(str(path), arrays, metadata={"a2ats": json.dumps(blob)})
    if change is not None:
        data = path.read_bytes()
        edits, cut = change
        path.write_bytes(mutate(data, [(at % len(data), b) for at, b in edits], cut))
    book = expect_one_line(lambda: Codebook.load(path), path)
    if book is not None:  # what loads is finite and within the documented bound
        for group in (book.centroids, book.assign_centroids, book.chol):
            assert all(bool(mx.all(mx.isfinite(a)).item()) for a in group)
            assert all(float(mx.max(mx.abs(a)).item()) <= MAX_ABS_VALUE for a in group)
        book.summary()


# -- the crossover table --------------------------------------------------------------------------


@SETTINGS
@given(
    raw=st.binary(max_size=200)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.lists(
        st.fixed_dictionaries(
            {
                "backend": st.just("cpu"),
                "machine": st.just("m"),
                "layers": st.integers(1, 4),
                "kv_heads": st.just(2),
                "head_dim": st.just(16),
                "exact_below": st.integers(0, 10),
            },
            optional={
                "ratios": json_values,
                "model": json_values,
                "date": json_values,
                "never": json_values,
                "step": json_values,
                "host_step": json_values,
                "host_step_kind": json_values,
            },
        ),
        max_size=3,
    ).map(lambda rows: json.dumps({"entries": rows}).encode())
)
def fuzz_crossover_table(raw):
    from a2ats_engine.cache import crossover as xo

    path = WORK / "crossover.json"
    path.write_bytes(raw)
    xo.reload_user_table()
    rows = expect_one_line(lambda: xo.user_table(path), path)
    assert isinstance(rows, dict)  # never raises: an unusable table is ignored
    for row in rows.values():
        xo._row_source(row)
        assert xo.host_step_of(row) in (None, "other", *xo.HOST_STEPS)


# -- session files --------------------------------------------------------------------------------


def _session_file():
    import mlx.core as mx
    from tiny import tiny_model

    from a2ats_engine import save_session
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.model_cache import make_cache

    path = WORK / "base_session.safetensors"
    if not path.exists():
        model = tiny_model("llama")
        book = Codebook.random(2, 2, 16, 16, seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache = make_cache(model, A2ATSConfig(window=8, sinks=2, budget=4), book)
        model(mx.array([list(range(3, 40))]), cache=cache)
        save_session(path, cache, {"title": "t"})
    return path


@SETTINGS
@given(
    change=mutations(8192), meta_path=st.lists(st.integers(0, 50), max_size=6), value=json_values
)
def fuzz_session(change, meta_path, value):
    import mlx.core as mx

    from a2ats_engine import load_session

    base = _session_file()
    path = WORK / "session.safetensors"
    arrays, meta = mx.load(str(base), return_metadata=True)
    blob = _set_json_path(json.loads(meta["a2ats-session"]), meta_path, value)
    mx.save_safetensors(str(path), arrays, metadata={"a2ats-session": json.dumps(blob)})
    data = path.read_bytes()
    edits, cut = change
    path.write_bytes(mutate(data, [(at % len(data), b) for at, b in edits], cut))
    expect_one_line(lambda: load_session(path), path)


# -- GGUF -------------------------------------------------------------------------------------------


def _gguf_file() -> Path:
    from tiny import tiny_model

    from .gguf_fixtures import write_tiny_gguf

    path = WORK / "base.gguf"
    if not path.exists():
        write_tiny_gguf(path, tiny_model("llama", seed=3))
    return path


@SETTINGS
@given(change=mutations(4096))
def fuzz_gguf_header(change):
    from a2ats_engine.loading.gguf_reader import read_header

    data = _gguf_file().read_bytes()
    header_end = min(len(data), 60_000)  # metadata and tensor table (the tokenizer is large)
    edits, cut = change
    edits = [(8 + at * 13 % (header_end - 8), blob) for at, blob in edits]
    path = WORK / "header.gguf"
    path.write_bytes(mutate(data, edits, cut))
    expect_one_line(lambda: read_header(path), path)


_GGUF_VALUE = st.one_of(
    st.tuples(st.sampled_from(["u32", "i32"]), st.integers(-(2**31), 2**31 - 1)).filter(
        lambda kv: kv[0] == "i32" or kv[1] >= 0
    ),
    st.tuples(st.just("u64"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("f32"), st.floats(width=32, allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("bool"), st.booleans()),
    st.text(max_size=10),
    st.tuples(st.just("u32[]"), st.lists(st.integers(0, 2**32 - 1), max_size=3)),
    st.lists(st.text(max_size=4), max_size=3),
)
_LLAMA_KEYS = [
    "general.alignment", "general.file_type", "general.name", "llama.block_count",
    "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
    "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base",
    "llama.rope.dimension_count", "llama.rope.scaling.type", "llama.rope.scaling.factor",
    "llama.expert_count", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.token_type",
    "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template",
]  # fmt: skip


@settings(SETTINGS, max_examples=25)
@given(changes=st.dictionaries(st.sampled_from(_LLAMA_KEYS), _GGUF_VALUE, min_size=1, max_size=3))
def fuzz_gguf_metadata(changes):
    import shutil

    from tiny import tiny_model

    from a2ats_engine.loading import gguf

    from .gguf_fixtures import write_tiny_gguf

    path = WORK / "meta.gguf"
    out = WORK / "meta-out"
    shutil.rmtree(out, ignore_errors=True)
    write_tiny_gguf(path, _model(tiny_model), **changes)
    expect_one_line(lambda: gguf.convert_gguf(path, out), path)


_MODELS: dict = {}


def _model(factory):
    if "llama" not in _MODELS:
        _MODELS["llama"] = factory("llama", seed=3)
    return _MODELS["llama"]


TARGETS = {
    "codebook": fuzz_codebook,
    "crossover_table": fuzz_crossover_table,
    "session": fuzz_session,
    "gguf_header": fuzz_gguf_header,
    "gguf_metadata": fuzz_gguf_metadata,
}
