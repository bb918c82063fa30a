"""The block bootstrap: exact on degenerate data, honest on autocorrelated data."""

import math

import numpy as np
import pytest

from a2ats_engine.bench.stats import block_bootstrap_ci, default_block


def _ar1(phi: float, n: int, seed: int) -> np.ndarray:
    """x_t = phi x_{t-1} + e_t, e_t ~ N(0, 1), started in the stationary distribution."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi**2)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return x


def test_default_block_grows_as_the_cube_root():
    assert [default_block(n) for n in (1, 4, 8, 64, 256, 1000)] == [1, 1, 2, 4, 6, 10]


def test_constant_values_give_a_point_interval():
    mean, low, high = block_bootstrap_ci(np.full(50, 0.25))
    assert mean == low == high == pytest.approx(0.25)


def test_the_interval_is_deterministic_and_contains_the_mean():
    x = _ar1(0.3, 300, 1)
    assert block_bootstrap_ci(x) == block_bootstrap_ci(x)
    mean, low, high = block_bootstrap_ci(x)
    assert low < mean < high
    assert mean == pytest.approx(x.mean())


@pytest.mark.parametrize("phi", [0.0, 0.6])
def test_the_interval_has_the_true_width_on_autocorrelated_data(phi):
    # AR(1): the mean of n values has sd 1 / ((1 - phi) sqrt(n)) (long-run variance); an i.i.d.
    # interval would be sqrt((1 - phi) / (1 + phi)) as wide: half as wide at phi = 0.6
    n = 4000
    x = _ar1(phi, n, seed=7)
    _, low, high = block_bootstrap_ci(x)
    true_half = 1.96 / ((1 - phi) * math.sqrt(n))
    iid_half = 1.96 * x.std(ddof=1) / math.sqrt(n)
    assert 0.8 < (high - low) / 2 / true_half < 1.2
    if phi:
        assert iid_half / true_half < 0.6  # what the i.i.d. interval it replaces would say


def test_several_texts_are_resampled_each_within_itself():
    # two texts with different means: every resample keeps each text's share of tokens, so a
    # constant per text gives a point interval at the pooled mean
    mean, low, high = block_bootstrap_ci([np.zeros(30), np.ones(10)], block=4)
    assert mean == low == high == pytest.approx(10 / 40)


def test_bad_arguments():
    with pytest.raises(ValueError, match="no values"):
        block_bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        block_bootstrap_ci(np.ones(3), level=1.5)
