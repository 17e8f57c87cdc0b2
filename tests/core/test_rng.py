"""Counter-based randomness: pure functions of (seed, stage, id, draw), with the right distributions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core import rng


@given(st.lists(st.integers(0, 2**63), min_size=1, max_size=200, unique=True),
       st.integers(0, 2**32), st.integers(1, 50))
@settings(max_examples=60, deadline=None)
def test_draws_do_not_depend_on_how_ids_are_split(ids, seed, cut):
    """The same id gets the same number whether drawn alone, in a batch, or in any split of it."""
    ids = np.array(ids, dtype=np.uint64)
    whole = rng.uniform(seed, "stage", ids)
    parts = np.concatenate([rng.uniform(seed, "stage", ids[i:i + cut]) for i in range(0, len(ids), cut)])
    assert np.array_equal(whole, parts)
    single = np.array([rng.uniform(seed, "stage", ids[i:i + 1])[0] for i in range(len(ids))])
    assert np.array_equal(whole, single)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=300, unique=True), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_keyed_hash_is_a_bijection_so_sort_keys_never_tie(ids, seed):
    keys = rng.keyed_hash(seed, "shuffle", np.array(ids, dtype=np.uint64))
    assert len(np.unique(keys)) == len(ids)


def test_streams_differ_by_seed_stage_and_draw():
    ids = rng.example_ids(3, 0, 1000)
    base = rng.uniform(1, "a", ids)
    for other in (rng.uniform(2, "a", ids), rng.uniform(1, "b", ids), rng.uniform(1, "a", ids, draw=1)):
        assert not np.array_equal(base, other)
        assert abs(np.corrcoef(base, other)[0, 1]) < 0.1


def test_uniform_is_uniform():
    u = rng.uniform(42, "u", rng.example_ids(0, 0, 200_000))
    assert u.min() >= 0.0 and u.max() < 1.0
    observed, _ = np.histogram(u, bins=20, range=(0, 1))
    expected = len(u) / 20
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < 43.8  # chi-square 19 dof, p = 0.001


@pytest.mark.parametrize("rate", [0.0, 0.5, 3.0, 9.99, 10.0, 87.5, 200.0, 1e4, 1e7])
def test_poisson_mean_and_variance(rate):
    """Any rate works (resample_at_rate's float32 Knuth method breaks above 87); mean and variance match."""
    n = 100_000
    counts = rng.poisson(5, "rate", rng.example_ids(0, 0, n), np.full(n, rate))
    assert counts.min() >= 0
    if rate == 0:
        assert counts.max() == 0
        return
    se = np.sqrt(rate / n)
    assert abs(counts.mean() - rate) < 5 * se
    assert abs(counts.var() / rate - 1) < 5 * np.sqrt(2 / n) + 0.01


def test_poisson_small_rate_pmf():
    n = 200_000
    counts = rng.poisson(9, "pmf", rng.example_ids(1, 0, n), np.full(n, 2.0))
    from math import exp, factorial
    for k in range(6):
        p = exp(-2.0) * 2.0 ** k / factorial(k)
        assert abs((counts == k).mean() - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_example_ids_encode_shard_and_row():
    ids = rng.example_ids(5, 10, 3)
    assert list(ids >> np.uint64(rng.SHARD_BITS)) == [5, 5, 5]
    assert list(ids & np.uint64((1 << rng.SHARD_BITS) - 1)) == [10, 11, 12]
