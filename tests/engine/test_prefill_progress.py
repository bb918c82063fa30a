"""The prefill progress line shared by the app's reply bubble and scripted mode."""

from __future__ import annotations

from a2ats_engine.progress import LONG_PREFILL_TOKENS, prefill_eta, prefill_text


def test_eta_is_the_time_left_at_the_rate_so_far():
    # 2,048 of 10,000 tokens in 4 s: 512 tok/s, 7,952 tokens left.
    assert prefill_eta(2048, 10_000, 4.0) == 7952 / 512
    assert prefill_eta(0, 10_000, 0.0) is None  # before the first chunk
    assert prefill_eta(10_000, 10_000, 9.0) is None  # done


def test_the_line_gives_tokens_done_of_total_and_the_time_left():
    assert prefill_text(2048, 10_000, 4.0) == (
        "Reading the prompt: 2,048 / 10,000 tokens (20%), about 16 s left"
    )
    assert prefill_text(1000, 100_000, 30.0).endswith("about 49 min 30 s left")
    assert prefill_text(0, 10_000, 0.0) == "Reading the prompt: 0 / 10,000 tokens (0%)"


def test_short_and_finished_prefills_show_nothing():
    assert prefill_text(0, LONG_PREFILL_TOKENS - 1, 0.0) == ""
    assert prefill_text(30, 31, 0.1) == ""
    assert prefill_text(500, 500, 1.0) == ""
    assert prefill_text(0, LONG_PREFILL_TOKENS, 0.0) != ""
