"""The model compatibility matrix: every mlx-lm family runs A2ATS correctly or is refused by name.

Each family is a tiny random-weight model from mlx-lm's own ModelArgs (a2ats_engine/cache/
model_matrix.py). Supported: with a budget that keeps every token, greedy tokens and logits equal
the model's own cache; with a small budget every A2ATS layer retrieves and every native layer
keeps the model's cache; save / load and trim round-trip; the Mac way (bfloat16 / float16
activations, 4-bit weights, MLX-side top-K) agrees too. Refused: one-line error at make_cache.
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from tiny import made_for

from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.layer_plan import A2ATS, NATIVE, NOPE, plan_for
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cache.model_matrix import FAMILIES, family_row, markdown, tiny_family_model
from a2ats_engine.cache.persist import load_session, save_session
from a2ats_engine.errors import ModelNotSupportedError

REFUSED = {"gemma2", "cohere2", "exaone4", "deepseek_v3"}
SUPPORTED = [f for f in FAMILIES if f not in REFUSED]
PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 120, size=40)]
EXACT = A2ATSConfig(window=4, sinks=2, budget=len(PROMPT) + 16)
SMALL = A2ATSConfig(window=4, sinks=2, budget=3, telemetry=True)
# the Mac way, on a subset (one of each kind: plain, sliding, hybrid, NoPE, sinks)
MAC_FAMILIES = ["llama", "qwen3", "gemma3_text", "qwen3_next", "smollm3", "gpt_oss", "phi3"]
# a 4-layer Gemma 3 whose sliding layers (window 8, every other layer) a short chat outgrows
SLIDING_GEMMA3 = dict(
    num_hidden_layers=4, head_dim=16, sliding_window=8, sliding_window_pattern=2,
    query_pre_attn_scalar=16,
)  # fmt: skip


def codebook_for(model, n_centroids: int = 16) -> Codebook:
    from a2ats_engine.cache.geometry import model_geometry

    first = next(c for c in plan_for(model).layers if c.kind == A2ATS)
    layers = model_geometry(model).num_layers  # decoder layers (KV-shared ones included)
    return made_for(
        model, Codebook.random(layers, first.n_kv_heads, first.head_dim, n_centroids, seed=1)
    )


def greedy(model, caches, steps: int = 5) -> tuple[list[int], mx.array]:
    """Prefill PROMPT, then `steps` greedy tokens. Returns (tokens, last-step logits [V])."""
    logits = model(mx.array([PROMPT]), cache=caches)[0, -1]
    tokens = []
    for _ in range(steps):
        token = int(mx.argmax(logits).item())
        tokens.append(token)
        logits = model(mx.array([[token]]), cache=caches)[0, -1]
    return tokens, logits.astype(mx.float32)


@pytest.fixture(scope="module", params=SUPPORTED)
def supported(request):
    return request.param, tiny_family_model(request.param)


def test_full_budget_equals_the_models_own_cache(supported):
    family, model = supported
    ref_tokens, ref_logits = greedy(model, make_prompt_cache(model))
    caches = make_cache(model, EXACT, codebook_for(model))
    tokens, logits = greedy(model, caches)
    assert tokens == ref_tokens, family
    assert float(mx.abs(logits - ref_logits).max()) < 1e-4, family


def test_small_budget_retrieves_on_every_a2ats_layer(supported):
    family, model = supported
    plan = plan_for(model)
    natives = make_prompt_cache(model)
    caches = make_cache(model, SMALL, codebook_for(model))
    greedy(model, caches, steps=2)
    for choice, cache, native in zip(plan.layers, caches, natives, strict=True):
        if choice.kind == A2ATS:
            assert isinstance(cache, A2ATSCache)
            stats = cache.last_stats
            assert stats is not None and not stats.exact, (family, choice.layer)
            assert all(len(s) < stats.offset for s in stats.selected)
            assert cache.tokens_retrieved > 0
        else:
            assert choice.kind == NATIVE and choice.reason
            assert type(cache) is type(native) and not isinstance(cache, A2ATSCache)


def test_save_load_and_trim_round_trip(supported, tmp_path):
    family, model = supported
    caches = make_cache(model, SMALL, codebook_for(model))
    greedy(model, caches, steps=1)
    save_session(tmp_path / "s.safetensors", caches, {"family": family})
    restored, meta = load_session(tmp_path / "s.safetensors", model)
    assert meta == {"family": family}
    assert [type(c) for c in restored] == [type(c) for c in caches]
    a = model(mx.array([[7]]), cache=caches)
    b = model(mx.array([[7]]), cache=restored)
    assert float(mx.abs(a - b).max()) < 1e-5, family
    if can_trim_prompt_cache(caches):
        after = model(mx.array([[9, 11]]), cache=caches)[0, -1]
        assert trim_prompt_cache(caches, 2) == 2
        again = model(mx.array([[9, 11]]), cache=caches)[0, -1]
        assert float(mx.abs(after - again).max()) < 1e-5, family
    else:  # only the model's own caches can refuse to trim (sliding windows, conv state)
        assert all(c.is_trimmable() for c in caches if isinstance(c, A2ATSCache))


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_refused_families_fail_at_make_cache_with_one_line(family):
    model = tiny_family_model(family)
    with pytest.raises(ModelNotSupportedError) as err:
        make_cache(model, SMALL, None)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{plan_for(model).model_type}: ")


def test_gemma2_is_refused_because_attention_is_written_by_hand():
    plan = plan_for(tiny_family_model("gemma2"))
    assert "computed by hand" in plan.refused


def test_nope_and_sliding_layers_are_native():
    smol = plan_for(tiny_family_model("smollm3"))
    assert [c.kind for c in smol.layers] == [A2ATS, NATIVE, A2ATS, NATIVE]
    assert smol.layers[1].reason == NOPE
    assert smol.summary() == "A2ATS on 2 of 4 layers"
    cohere = plan_for(tiny_family_model("cohere2"))  # global layers have a .rope they skip
    assert {c.reason for c in cohere.layers} == {"sliding window 8", NOPE}
    gemma = plan_for(tiny_family_model("gemma3_text"))
    assert [c.reason for c in gemma.layers] == ["sliding window 8", "", "sliding window 8", ""]


def test_runtime_guard_raises_when_attend_is_skipped():
    model = tiny_family_model("llama")
    caches = make_cache(model, SMALL, codebook_for(model))
    model(mx.array([PROMPT]), cache=caches)
    k = mx.zeros((1, 2, 1, 16))
    caches[0].update_and_fetch(k, k)  # a decode step whose attention bypassed `attend`
    with pytest.raises(ModelNotSupportedError, match="did not attend through A2ATS"):
        caches[0].update_and_fetch(k, k)


def test_attention_sinks_reach_the_a2ats_cache():
    model = tiny_family_model("gpt_oss")
    for layer in model.model.layers:  # nonzero sinks, so ignoring them would show
        layer.self_attn.sinks = mx.full(layer.self_attn.sinks.shape, 2.0)
    ref_tokens, ref_logits = greedy(model, make_prompt_cache(model))
    tokens, logits = greedy(model, make_cache(model, EXACT, codebook_for(model)))
    assert tokens == ref_tokens
    assert float(mx.abs(logits - ref_logits).max()) < 1e-4


def test_selected_attention_with_sinks_equals_mlx_attention_with_sinks():
    """The retrieval path's softmax over a selection that holds every token, sinks included,
    is MLX's own attention with sinks (and differs from it without them)."""
    from a2ats_engine.cache.attention import selected_attention

    n_kv, G, M, d = 2, 3, 20, 16
    q, k, v = (mx.random.normal(s, key=mx.random.key(i)) for i, s in
               enumerate([(1, n_kv, G, d), (1, n_kv, M, d), (1, n_kv, M, d)]))  # fmt: skip
    sinks = mx.array([0.5, 2.0, -1.0, 3.0, 0.0, 1.5])  # one per query head [n_kv * G]
    repeat = mx.zeros((1, n_kv, M), dtype=mx.bool_)
    ours = selected_attention(q, k, v, repeat, 0.25, sinks)
    ref = mx.fast.scaled_dot_product_attention(
        q.reshape(1, n_kv * G, 1, d), k, v, scale=0.25, sinks=sinks
    ).reshape(1, n_kv, G, d)
    assert float(mx.abs(ours - ref).max()) < 1e-5
    assert float(mx.abs(selected_attention(q, k, v, repeat, 0.25) - ref).max()) > 1e-3


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("family", MAC_FAMILIES)
def test_the_mac_way_quantized_half_precision_mlx_top_k(family, dtype, monkeypatch):
    monkeypatch.setenv("A2ATS_TOPK", "mlx")
    model = tiny_family_model(family)
    model.set_dtype(dtype)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    ref_tokens, ref_logits = greedy(model, make_prompt_cache(model))
    tokens, logits = greedy(model, make_cache(model, EXACT, codebook_for(model)))
    assert tokens == ref_tokens, family
    scale = float(mx.abs(ref_logits).max())
    assert float(mx.abs(logits - ref_logits).max()) <= 2e-2 * scale, family
    caches = make_cache(model, SMALL, codebook_for(model))
    greedy(model, caches, steps=2)
    a2ats = [c for c in caches if isinstance(c, A2ATSCache)]
    assert a2ats and all(not c.last_stats.exact for c in a2ats)
    assert all(c.tokens_retrieved > 0 for c in a2ats)  # counted by MLX on this path


def test_docs_models_md_matches_the_matrix():
    rows = [family_row(f) for f in FAMILIES]
    assert {r.family for r in rows if r.status == "refused"} == REFUSED
    path = Path(__file__).resolve().parents[3] / "docs" / "MODELS.md"
    assert path.read_text() == markdown(rows), (
        "docs/MODELS.md is stale: python -m a2ats_engine.cache.model_matrix --markdown "
        "> docs/MODELS.md"
    )


def test_cli_info_prints_the_plan(tmp_path, capsys):
    from tiny import save_tiny_model

    from a2ats_engine.cli import main

    folder = save_tiny_model(tmp_path / "g3", "gemma3_text", **SLIDING_GEMMA3)
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "A2ATS on 2 of 4 layers" in out
    assert "native    2  sliding window 8" in out
    assert main(["info", "--json", str(folder)]) == 0
    data = json.loads(capsys.readouterr().out)
    kinds = [layer["kind"] for layer in data["layer_plan"]["layers"]]
    assert kinds == [NATIVE, A2ATS, NATIVE, A2ATS]


def test_chat_session_on_a_sliding_window_model_matches_its_own_cache(tmp_path):
    """Two turns and a regenerate through ChatSession: the sliding layers' RotatingKVCache cannot
    be trimmed once the window has passed, so the session rebuilds; replies stay identical."""
    from tiny import tiny_model, tiny_tokenizer

    from a2ats_engine.session import ChatSession, SamplingSettings

    model = tiny_model("gemma3_text", **SLIDING_GEMMA3)
    tok = tiny_tokenizer(tmp_path)
    tok.eos_token_ids = []
    greedy_settings = SamplingSettings(temperature=0.0, max_tokens=6)
    config = A2ATSConfig(window=4, sinks=2, budget=4096)

    def replies(session) -> list[str]:
        out = []
        for step in ("Hello! How are you today?", "Tell me more.", None):
            events = session.send(step) if step else session.regenerate()
            out.append("".join(e.text for e in list(events)[:-1] if hasattr(e, "text")))
        return out

    ours = ChatSession(
        model, tok, sampling=greedy_settings, a2ats=config, codebook=codebook_for(model)
    )
    theirs = ChatSession(model, tok, sampling=greedy_settings)
    mine = replies(ours)
    assert mine == replies(theirs) and all(mine)


class _Bytes:
    """Bytes modulo the tiny vocabulary: a token stream for calibration."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [3 + b % 120 for b in text.encode("utf-8")]


@pytest.mark.parametrize("family", ["smollm3", "lfm2", "qwen3_next", "gemma4_text", "gpt_oss"])
def test_calibration_captures_the_a2ats_layers_only(family):
    """NoPE, conv / linear-attention and wider-global-head layers keep the model's own caches
    while calibrating; the codebook is indexed by model layer and serves make_cache."""
    from a2ats_engine.calibration.calibrate import calibrate

    model = tiny_family_model(family)
    plan = plan_for(model)
    config = A2ATSConfig(window=4, sinks=2, budget=3, telemetry=True)
    text = "The quick brown fox jumps over the lazy dog; 0123456789. " * 20
    book = calibrate(model, _Bytes(), [text], config, tokens=600, chunk_len=200, max_iters=2)
    assert book.num_layers == plan.num_layers + plan.shared_layers
    assert book.metadata["a2ats_layers"] == list(plan.a2ats_layers)
    assert book.metadata["model"]["model_type"] == plan.model_type
    caches = make_cache(model, config, book)  # validates the codebook against the model
    greedy(model, caches, steps=2)
    assert all(c.tokens_retrieved > 0 for c in caches if isinstance(c, A2ATSCache))


def test_gemma4_kv_shared_layers_are_counted_and_decode_like_the_model():
    from mlx_lm.utils import _get_classes

    from a2ats_engine.cache.model_matrix import family_config

    config = {**family_config("gemma4_text"), "num_hidden_layers": 6, "num_kv_shared_layers": 2}
    config["layer_types"] = ["sliding_attention", "full_attention"] * 3
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    plan = plan_for(model)
    # all 6 decoder layers count: the 2 KV-shared ones attend exactly, never through A2ATS
    assert (plan.summary(), plan.shared_layers) == ("A2ATS on 2 of 6 layers", 2)
    assert (
        "  shared    2  reuse an earlier layer's K/V (exact attention over it)" in plan.describe()
    )

    ref_tokens, ref_logits = greedy(model, make_prompt_cache(model))
    tokens, logits = greedy(model, make_cache(model, EXACT, codebook_for(model)))
    assert tokens == ref_tokens and float(mx.abs(logits - ref_logits).max()) < 1e-4


def test_a_model_the_probe_cannot_run_is_refused_in_one_line(monkeypatch):
    model = tiny_family_model("qwen2")
    attn_class = type(model.model.layers[0].self_attn)

    def broken(self, x, mask=None, cache=None):
        raise RuntimeError("unexpected cache type\nsecond line")

    monkeypatch.setattr(attn_class, "__call__", broken)
    plan = plan_for(model)
    assert plan.refused.startswith("the layer-plan probe could not run it (RuntimeError: ")
    with pytest.raises(ModelNotSupportedError) as err:
        make_cache(model, SMALL, None)
    assert "\n" not in str(err.value) and str(err.value).startswith("qwen2: ")
