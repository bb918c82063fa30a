"""The metric functions of an evaluation (`evaluate.py`): exact-attention recall, relative
output error, per-token NLL and perplexity, and the paired perplexity ratio with its interval."""

from __future__ import annotations

import math

import numpy as np

from .stats import block_bootstrap_ci


def attention_recall(probs: np.ndarray, attended: np.ndarray) -> float:
    """Mean exact-attention mass on the attended positions.

    probs: exact attention probabilities `[..., N]` (rows sum to 1); attended: bool `[..., N]`
    broadcastable to probs. Returns the mass on attended positions averaged over all rows.
    """
    probs = np.asarray(probs, dtype=np.float64)
    mask = np.broadcast_to(np.asarray(attended, dtype=bool), probs.shape)
    return float(np.where(mask, probs, 0.0).sum(axis=-1).mean())


def relative_l2_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """`||approx - exact||_2 / ||exact||_2` over all elements (0 when both are zero)."""
    approx = np.asarray(approx, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    norm = float(np.linalg.norm(exact))
    diff = float(np.linalg.norm(approx - exact))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target: logits `[M, V]`, targets int `[M]` -> `[M]`."""
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    top = logits.max(axis=-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return log_z - logits[np.arange(len(targets)), targets]


def perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    """exp(mean NLL) of the targets under the logits (`[M, V]`, `[M]`)."""
    return float(np.exp(token_nll(logits, targets).mean()))


def paired_ppl_ratio(
    nll: np.ndarray, reference_nll: np.ndarray, block: int | None = None
) -> tuple[float, float, float]:
    """ppl(method) / ppl(reference) on the same tokens, with a 95% interval.

    nll, reference_nll: per-token NLL `[M]` of the same consecutive targets. The ratio is
    `exp(mean(nll - reference_nll))`; the interval is exp of the circular block bootstrap
    interval of that mean (`stats.block_bootstrap_ci`, blocks of `block` tokens, default
    floor(M^(1/3))): neighbouring tokens are not independent. Returns (ratio, low, high)."""
    delta = np.asarray(nll, dtype=np.float64) - np.asarray(reference_nll, dtype=np.float64)
    mean, low, high = block_bootstrap_ci(delta, block=block)
    return math.exp(mean), math.exp(low), math.exp(high)
