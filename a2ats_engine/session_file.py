"""Reopen a long chat without prefilling it again: a ChatSession's caches in a file.

`save_cache` writes the session's caches (`cache/persist.py`: every layer's rows and codes, the
codebook, a cold tier's rows read back) with what they were made for: the model's fingerprint
(geometry, RoPE, config hash) and a hash of a sample of its weights, the A2ATS settings, the
codebook's sha256 and the token ids the caches hold. `restore_cache` adopts them only when all
of that matches the session now and the ids start like the conversation's prompt; anything
else is refused with the reason (the next reply then prefills as usual), so a cache is never
used for another model, codebook or setting.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .cache.codebook_check import model_fingerprint
from .cache.persist import load_session, save_session
from .data_dirs import cache_dir
from .errors import A2ATSError
from .session import ChatSession, common_prefix

KIND = "a2ats-chat-cache"
CHATS_FOLDER = "chats"  # saved chat caches, under the cache folder
SAVE_FROM_TOKENS = 1024  # a chat this long is worth a file: its prefill takes seconds on a CPU
KEEP_BYTES = 4 * 2**30  # saved chat caches kept at most; the least recently used go first
SAMPLED_ARRAYS = 8  # weights hashed: the first elements of this many parameter arrays
SAMPLED_VALUES = 4096


def weights_sample_hash(model: Any) -> str:
    """sha256 (16 hex) of the first values of the model's first parameter arrays: two models
    with one config but other weights (a fine-tune) differ here."""
    digest = hashlib.sha256()
    for name, array in tree_flatten(model.parameters())[:SAMPLED_ARRAYS]:
        sample = array.reshape(-1)[:SAMPLED_VALUES]
        if sample.dtype == mx.bfloat16:
            sample = sample.astype(mx.float32)
        digest.update(name.encode())
        digest.update(np.array(sample).tobytes())
    return digest.hexdigest()[:16]


def _identity(session: ChatSession) -> dict[str, Any]:
    """What a saved cache must match: model, weights, cache kind and settings, codebook."""
    factory = session.cache_factory
    config = getattr(factory, "a2ats_config", None)
    codebook = getattr(factory, "codebook", None)
    return {
        "model": model_fingerprint(session.model),
        "weights": weights_sample_hash(session.model),
        "a2ats": None if config is None else config.to_dict(),
        "codebook": None if codebook is None else codebook.sha256,
    }


def save_cache(session: ChatSession, path: str | os.PathLike) -> None:
    """Write the session's caches and what they were made for (nothing when it has none)."""
    caches = session.caches
    if not caches or not session.context_tokens:
        raise A2ATSError("this chat has no cache to save yet (nothing was generated)")
    meta = {"kind": KIND, "identity": _identity(session), "token_ids": session.cached_token_ids}
    save_session(path, caches, meta)


def restore_cache(session: ChatSession, path: str | os.PathLike) -> str | None:
    """Adopt the caches saved at `path` when they fit this session; None when adopted, else
    the reason they were refused (the next reply prefills the conversation)."""
    factory = session.cache_factory
    codebook = getattr(factory, "codebook", None)
    try:
        caches, meta = load_session(path, session.model, codebook)
    except A2ATSError as exc:
        return str(exc)
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        return f"{os.fspath(path)}: not a saved chat cache"
    ids = meta.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return f"{os.fspath(path)}: the token ids are missing or damaged"
    saved, now = meta.get("identity") or {}, _identity(session)
    for key, what in (
        ("model", "another model"),
        ("weights", "another model's weights"),
        ("a2ats", "other cache settings"),
        ("codebook", "another codebook"),
    ):
        if saved.get(key) != now[key]:
            return f"the saved cache was made with {what}; the chat will be prefilled again"
    if not session.messages:
        return "load the conversation before its cache (the cache must match its start)"
    prompt = session.prompt_token_ids()
    if common_prefix(ids, prompt) == 0:
        return "the saved cache does not match this conversation; it will be prefilled again"
    session.adopt_cache(caches, ids)  # the next reply trims it to the shared prefix
    return None


def chats_dir() -> Path:
    """Where chats' saved caches live (`$A2ATS_CACHE_DIR/chats` or the user cache folder)."""
    return cache_dir() / CHATS_FOLDER


def chat_cache_path(conversation_id: str, folder: Path | None = None) -> Path:
    """The file that keeps one chat's cache: named by a hash of the chat's id, so an id read
    from a chat file is never part of a path."""
    digest = hashlib.sha256(conversation_id.encode("utf-8", "replace")).hexdigest()[:32]
    return (folder if folder is not None else chats_dir()) / f"{digest}.safetensors"


def prune_chat_caches(folder: Path | None = None, keep_bytes: int = KEEP_BYTES) -> list[Path]:
    """Remove the least recently written saved caches until the rest fit in `keep_bytes`;
    returns the removed paths (files that vanish or cannot be removed meanwhile are skipped)."""
    folder = folder if folder is not None else chats_dir()
    entries = []
    for path in folder.glob("*.safetensors") if folder.is_dir() else ():
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, path in sorted(entries):  # oldest first
        if total <= keep_bytes:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed.append(path)
    return removed
