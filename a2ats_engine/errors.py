"""Errors the engine raises for bad input. Each message names the problem in one line."""

from __future__ import annotations


class A2ATSError(Exception):
    """Base class: a user-facing problem (bad file, bad setting), not a bug."""


class ModelLoadError(A2ATSError):
    """A model source could not be loaded (missing path, corrupt GGUF, unsupported arch, offline)."""


class CodebookError(A2ATSError):
    """A codebook file is unreadable, foreign, truncated or does not fit the model."""


class ModelNotSupportedError(A2ATSError):
    """A model A2ATS cannot serve (no global RoPE layer, or attention the hook cannot route)."""
