"""Fixtures several engine test modules share (a module's own fixture of the same name wins)."""

from __future__ import annotations

import pytest
from tiny import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def llama():
    """The tiny random Llama (2 layers), built once per test module."""
    return tiny_model("llama")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny tokenizer, saved and loaded once per test module."""
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))
