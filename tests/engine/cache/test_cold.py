"""The cold storage kind: K/V rows in a memory-mapped file, codes in memory (cache/cold.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import mlx.core as mx
import pytest

from a2ats_engine.cache import cold, native_step
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cache.persist import load_session, save_session
from tests.tiny import tiny_model

CONFIG = A2ATSConfig(window=16, sinks=4, budget=8, exact_below=0)
PROMPT = [3 + i % 390 for i in range(300)]


@pytest.fixture(autouse=True)
def kv_folder(tmp_path, monkeypatch):
    """Every test gets its own cache folder and a fresh process folder."""
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cold, "_process_dir", None)
    return tmp_path / "cache" / "kv"


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def book():
    return Codebook.random(2, 2, 16, 32, seed=5)


def decode(model, cache, prompt=PROMPT, steps=12):
    """Greedy tokens after prefilling `prompt` (the last logits of each step compared too)."""
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    tokens, outs = [], []
    for _ in range(steps):
        tok = int(mx.argmax(logits, axis=-1).item())
        tokens.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)[:, -1]
        outs.append(logits)
    return tokens, mx.stack(outs)


def cold_config(limit=0, **kw):
    return A2ATSConfig(**{**CONFIG.to_dict(), "kv_memory": limit, **kw})


def test_a_gather_takes_the_rows_in_memory_would_give():
    """Rows equal resident rows for repeated, unsorted positions of every head, keys and values;
    every row taken is counted as read; rows rewritten after a truncate read back new."""
    from a2ats_engine.cache.storage import KEYS, VALUES, ResidentRows, RowStorage

    B, n_kv, n, d = 1, 2, 600, 8
    k = mx.random.normal((B, n_kv, n, d), key=mx.random.key(1))
    v = mx.random.normal((B, n_kv, n, d), key=mx.random.key(2))
    rows, ref = cold.ColdRows(0, "t"), ResidentRows(RowStorage())
    rows.append(k, v, 0)
    ref.append(k, v, 0)
    assert rows.spilled
    positions = mx.array([[[590, 3, 3, 200, 17, 590], [5, 400, 5, 6, 7, 8]]], dtype=mx.int32)
    for which in (KEYS, VALUES):
        before = rows.read_bytes
        assert mx.array_equal(rows.gather(which, positions), ref.gather(which, positions))
        assert rows.read_bytes - before == 12 * d * 4  # float32 rows of one head

    rows.truncate(300)
    ref.truncate(300)
    k2 = mx.random.normal((B, n_kv, n - 300, d), key=mx.random.key(3))
    rows.append(k2, k2, 300)
    ref.append(k2, k2, 300)
    assert mx.array_equal(rows.gather(KEYS, positions), ref.gather(KEYS, positions))
    rows.close()


def test_low_bit_candidate_keys_are_resident_and_read_nothing_from_the_map():
    """The measured alternative: candidates' keys from a resident 4-bit copy (counted in the
    resident bytes), nothing read from the file for them; the selection's gather stays exact."""
    from a2ats_engine.cache.storage import KEYS, ResidentRows, RowStorage

    k = mx.random.normal((1, 2, 300, 64), key=mx.random.key(4))
    rows, plain = cold.ColdRows(0, "t", candidate_bits=4), cold.ColdRows(0, "p")
    for r in (rows, plain):
        r.append(k, k, 0)
    positions = mx.array([[[7, 250, 3], [299, 0, 8]]], dtype=mx.int32)
    before = rows.read_bytes
    low = rows.candidate_keys(positions)
    assert rows.read_bytes == before
    ref = ResidentRows(RowStorage())
    ref.append(k, k, 0)
    exact = ref.gather(KEYS, positions)
    error = float(mx.abs(low - exact).max())
    assert 0 < error < 0.5  # quantized, not the exact rows
    assert mx.array_equal(rows.gather(KEYS, positions), exact)
    assert rows.resident_bytes >= 300 * 2 * 64 // 2  # 4 bits a key element, at least
    assert plain.resident_bytes == 0
    assert mx.array_equal(plain.candidate_keys(positions), exact)
    rows.close()
    plain.close()


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_cold_tier_decodes_exactly_like_rows_in_memory(model, book):
    warm = make_cache(model, CONFIG, book)
    coldc = make_cache(model, cold_config(), book)
    with native_step.forced("numpy"):  # the rows in memory take the NumPy host step: the
        a, la = decode(model, warm)  # same top-K as the cold tier's generic step, ties included
    b, lb = decode(model, coldc)
    assert a == b
    assert float(mx.abs(la - lb).max()) < 1e-5
    assert coldc[0].retrieved_steps == 12  # the steps really retrieved (gathered from the file)
    c = coldc[0]
    assert c.rows.spilled and c.rows.path.is_file()
    # in memory: the codes only; on disk: every K/V row (float32 here)
    assert c.resident_bytes == c.codes.nbytes
    n_kv, d = 2, 16
    assert c.disk_bytes == c.offset * 2 * n_kv * d * 4
    assert c.nbytes < warm[0].nbytes / 2
    # a retrieval step reads back the rows it attends, not the file (the prefill read it whole)
    before = c.rows.read_bytes
    model(mx.array([[5]]), cache=coldc)
    step = c.rows.read_bytes - before
    assert 0 < step < c.disk_bytes / 4


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_kv_memory_limit_keeps_rows_resident_until_the_share_is_used(model, book):
    row = 2 * 2 * 16 * 4  # K and V of one token, 2 KV heads, d 16, float32
    limit = 2 * 200 * row  # two A2ATS layers, each 200 rows
    cache = make_cache(model, cold_config(limit), book)
    model(mx.array([PROMPT[:150]]), cache=cache)
    assert cache[0].kv_share == 200 * row
    assert not cache[0].rows.spilled and cache[0].disk_bytes == 0
    model(mx.array([PROMPT[150:]]), cache=cache)
    assert cache[0].rows.spilled and cache[0].resident_bytes == cache[0].codes.nbytes


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_trim_truncates_the_file_and_continues_like_a_fresh_prefill(model, book):
    cache = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT + list(range(3, 303))]), cache=cache)
    path = cache[0].rows.path
    before = path.stat().st_size
    for c in cache:
        c.trim(300)
    assert path.stat().st_size < before
    a = model(mx.array([[21]]), cache=cache)
    fresh = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT]), cache=fresh)
    b = model(mx.array([[21]]), cache=fresh)
    assert float(mx.abs(a - b).max()) < 1e-5


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_state_round_trip_of_a_cold_cache_and_a_saved_session(model, book, tmp_path):
    cache = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT]), cache=cache)
    # `state` holds what is resident (the codes): mlx-lm evaluates it after every prefill chunk
    assert [a.shape for a in cache[0].state] == [cache[0].codes[..., :300, :].shape]
    with pytest.raises(ValueError, match="codes only"):
        A2ATSCache.from_state(cache[0].state, cache[0].meta_state, codebook=book)
    rebuilt = [A2ATSCache.from_state(c.export_state(), c.meta_state, codebook=book) for c in cache]
    assert rebuilt[0].kv_share == 0 and rebuilt[0].rows.spilled
    assert rebuilt[0].rows.path != cache[0].rows.path  # two caches never share a file
    save_session(tmp_path / "s.safetensors", cache)
    loaded, _ = load_session(tmp_path / "s.safetensors", model, book)
    a = model(mx.array([[7]]), cache=cache)
    b = model(mx.array([[7]]), cache=rebuilt)
    c = model(mx.array([[7]]), cache=loaded)
    assert float(mx.abs(a - b).max()) < 1e-5 and float(mx.abs(a - c).max()) < 1e-5


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_closing_or_dropping_a_cache_removes_its_file(model, book):
    cache = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT]), cache=cache)
    first, second = (c.rows.path for c in cache)
    cache[0].close()
    assert not first.exists() and second.exists()
    del cache
    import gc

    gc.collect()
    assert not second.exists()


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_failed_write_brings_the_rows_back_to_memory_and_says_so(model, book, monkeypatch):
    warm = make_cache(model, CONFIG, book)
    coldc = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT]), cache=warm)
    model(mx.array([PROMPT]), cache=coldc)
    path = coldc[0].rows.path

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cold.os, "pwrite", full_disk)
    grow = list(range(3, 3 + 260))  # past the file's allocated rows: it grows, then the write fails
    with pytest.warns(UserWarning, match="could not be written .*No space left"):
        a = model(mx.array([grow]), cache=coldc)[:, -1]
    b = model(mx.array([grow]), cache=warm)[:, -1]
    assert float(mx.abs(a - b).max()) < 1e-5  # nothing lost: the same answer
    c = coldc[0]
    assert not c.rows.spilled and "No space left" in c.rows.fault
    assert not path.exists() and c.disk_bytes == 0


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_read_only_cache_folder_keeps_rows_in_memory(model, book, kv_folder, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(cold, "kv_dir", refuse)
    cache = make_cache(model, cold_config(), book)
    with pytest.warns(UserWarning, match="could not write the cold tier .*Read-only"):
        tokens, _ = decode(model, cache, steps=3)
    assert tokens == decode(model, make_cache(model, CONFIG, book), steps=3)[0]
    assert not cache[0].rows.spilled


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "replace"])
@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_file_damaged_behind_the_map_is_named_never_read(model, book, damage):
    cache = make_cache(model, cold_config(), book)
    model(mx.array([PROMPT]), cache=cache)
    path = cache[0].rows.path
    if damage == "truncate":
        os.truncate(path, 1024)
    elif damage == "overwrite":
        with open(path, "r+b") as f:
            f.write(b"\0" * 64)
    else:
        path.unlink()
        path.write_bytes(b"\0" * 4096)
    with pytest.raises(cold.ColdTierError, match=str(path.name)):
        model(mx.array([[9]]), cache=cache)


def test_folders_of_dead_processes_are_swept_and_live_ones_kept(kv_folder):
    kv_folder.mkdir(parents=True)
    dead = kv_folder / "999999-dead"
    dead.mkdir()
    (dead / cold._LOCK).touch()
    (dead / "layer000-x.rows").write_bytes(b"\0" * 100)
    half = kv_folder / "888888-half"  # a crash before the lock was made
    half.mkdir()
    live = kv_folder / "777777-live"
    live.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(live / cold._LOCK),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        mine = cold.kv_dir()  # the first use sweeps
        assert not dead.exists() and not half.exists()
        assert live.exists() and mine.exists() and mine.parent == kv_folder
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_kv_memory_is_range_checked_and_not_combined_with_kv_bits():
    with pytest.raises(ValueError, match="kv_memory=-1 is out of range"):
        A2ATSConfig(kv_memory=-1)
    with pytest.raises(ValueError, match="kv_memory=0 cannot be combined with kv_bits=8"):
        A2ATSConfig(kv_memory=0, kv_bits=8)


@pytest.mark.demo
def test_the_demo_model_answers_the_same_from_the_cold_tier(tmp_path):
    """The real model, 1.5K tokens of context, retrieval on every step: the same 16 greedy
    tokens with every K/V row in the file as with rows in memory, and only codes resident."""
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.data_dirs import demo_codebook_path
    from a2ats_engine.loading.models import load_model
    from tests.demo_gate import require_demo

    require_demo()
    model, tokenizer, _ = load_model("demo")
    book = Codebook.load(demo_codebook_path())
    text = " ".join(f"Item {i} is stored in box {i * 7 % 101}." for i in range(160))
    prompt = tokenizer.encode(text + " Item 42 is stored in box")[:1500]
    config = A2ATSConfig(exact_below=0)
    warm = decode(model, make_cache(model, config, book), prompt, steps=16)
    cache = make_cache(model, A2ATSConfig(exact_below=0, kv_memory=0), book)
    coldrun = decode(model, cache, prompt, steps=16)
    assert coldrun[0] == warm[0]
    assert all(c.rows.spilled and c.resident_bytes == c.codes.nbytes for c in cache)
    assert cache[0].retrieved_steps == 16


def test_bench_cold_checks_every_flag_before_any_work(capsys, monkeypatch):
    from a2ats_engine.bench import cold_tier
    from a2ats_engine.cli import main

    def no_run(*args, **kwargs):
        raise AssertionError("a run started before the flags were checked")

    monkeypatch.setattr(cold_tier, "measure", no_run)
    for flags, message in (
        (["--contexts", "10"], "--contexts: 10 is out of range"),
        (["--methods", "full,bogus"], "unknown 'bogus'; valid: full, a2ats, a2ats_cold"),
        (["--geometry", "gpt5"], "--geometry: unknown 'gpt5'"),
        (["--steps", "0"], "--steps=0 is out of range"),
        (["--data-limit", "-1"], "--data-limit=-1.0 is out of range"),
        (["--page-cache", "cold"], "--page-cache cold needs --speed"),
    ):
        assert main(["bench", "cold", *flags]) != 0
        assert message in capsys.readouterr().err


def test_bench_cold_speed_with_low_bit_candidates_and_a_dropped_page_cache(tmp_path, monkeypatch):
    """The speed run on the tiny geometry: the low-bit candidate copy is counted in the cold
    tier's resident bytes, and the dropped-page-cache steps run and say whether they dropped."""
    from a2ats_engine.bench.cold_tier import measure

    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    config = A2ATSConfig(exact_below=0)
    plain = measure("tiny", 512, "speed", 4, config, page_cache="cold")
    low = measure("tiny", 512, "speed", 4, config, candidate_bits=4)
    assert low["candidate_bits"] == 4 and plain["candidate_bits"] is None
    assert low["cold_resident_bytes"] > plain["cold_resident_bytes"]
    assert low["cold_page_cache"] is None
    dropped = plain["cold_page_cache"]
    assert dropped["dropped"] is sys.platform.startswith("linux")
    assert len(dropped["ratio_runs"]) == 1 and dropped["ratio_median"] > 0


def test_dropping_the_page_cache_keeps_every_row(model, book):
    """After the file's pages are dropped (and the map closed) the rows read back the same."""
    from a2ats_engine.cache.storage import KEYS, VALUES

    rows = cold.ColdRows(0, "d")
    assert not rows.drop_page_cache()  # nothing on disk yet
    k = mx.random.normal((1, 2, 300, 8), key=mx.random.key(6))
    rows.append(k, -k, 0)
    positions = mx.array([[[1, 299, 150], [0, 7, 8]]], dtype=mx.int32)
    before = rows.gather(KEYS, positions), rows.gather(VALUES, positions)
    assert rows.drop_page_cache() is hasattr(os, "posix_fadvise")
    assert mx.array_equal(rows.gather(KEYS, positions), before[0])
    assert mx.array_equal(rows.gather(VALUES, positions), before[1])
    rows.close()


def test_bench_cold_measures_each_method_in_its_own_process(tmp_path, monkeypatch):
    """A real run on the built-in tiny geometry: the cold tier holds the codes only and gives
    the same greedy tokens."""
    from a2ats_engine.bench.cold_tier import measure

    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    runs = {m: measure("tiny", 256, m, 4, A2ATSConfig()) for m in ("a2ats", "a2ats_cold")}
    assert runs["a2ats"]["tokens"] == runs["a2ats_cold"]["tokens"]
    assert runs["a2ats_cold"]["cache_disk_bytes"] > 0 == runs["a2ats"]["cache_disk_bytes"]
    assert runs["a2ats_cold"]["cache_resident_bytes"] < runs["a2ats"]["cache_resident_bytes"] / 4
    assert runs["a2ats_cold"]["anon_peak_sampled"] > 0
    assert (
        runs["a2ats_cold"]["disk_read_bytes_per_step"]
        > 0
        == runs["a2ats"]["disk_read_bytes_per_step"]
    )
