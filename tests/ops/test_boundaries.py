"""Bucket boundaries: bucket_by_sequence_length's assignment, and auto-buckets that are optimal and beat quantiles."""

from __future__ import annotations

import bisect
import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.errors import UsageError
from batchtool.ops.boundaries import (
    assign_buckets,
    check_boundaries,
    choose_boundaries,
    expected_efficiency,
    padded_elements,
    quantile_boundaries,
)

increasing = st.lists(st.integers(0, 60), min_size=1, max_size=8, unique=True).map(sorted)
histograms = st.lists(st.integers(0, 6), min_size=1, max_size=14).map(np.array)


def lognormal_counts(rows: int = 100_000, seed: int = 0, max_length: int = 2000) -> np.ndarray:
    lengths = np.clip(np.round(np.random.default_rng(seed).lognormal(np.log(100), 0.8, rows)), 1, max_length)
    return np.bincount(lengths.astype(np.int64))


@given(increasing, st.lists(st.integers(0, 70), max_size=50))
@settings(max_examples=200, deadline=None)
def test_assignment_matches_bisect_at_and_around_every_boundary(boundaries, extra):
    probes = sorted({max(0, b + d) for b in boundaries for d in (-1, 0, 1)} | set(extra))
    got = assign_buckets(np.array(probes, dtype=np.int64), boundaries)
    assert got.tolist() == [bisect.bisect_right(boundaries, x) for x in probes]
    assert got.dtype == np.int32


def test_seed_semantics_spelled_out():
    # < 10 -> 0, [10, 20) -> 1, >= 20 -> 2
    assert assign_buckets(np.array([0, 9, 10, 19, 20, 1000]), [10, 20]).tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("bad, message", [
    ((), "is empty"),
    ((5, 3), r"strictly increasing \(5 is followed by 3\)"),
    ((4, 4), r"strictly increasing \(4 is followed by 4\)"),
    ((-1, 3), "non-negative"),
    ((1.5, 3), "integers"),
])
def test_bad_boundaries_are_usage_errors(bad, message):
    with pytest.raises(UsageError, match=message):
        check_boundaries(bad)


def brute_force(counts: np.ndarray, k: int) -> int:
    values = np.flatnonzero(counts)
    return min(padded_elements(counts, [v + 1 for v in cut])
               for r in range(k) for cut in itertools.combinations(values[:-1].tolist(), r))


@given(histograms, st.integers(1, 5))
@settings(max_examples=250, deadline=None)
def test_auto_buckets_equal_the_brute_force_optimum(counts, k):
    if not counts.any():
        assert choose_boundaries(counts, k) == ()
        return
    chosen = choose_boundaries(counts, k)
    assert len(chosen) <= k - 1
    assert list(chosen) == sorted(set(chosen))
    assert padded_elements(counts, chosen) == brute_force(counts, k)


@given(st.lists(st.integers(0, 40), min_size=2, max_size=60).map(np.array), st.integers(2, 9))
@settings(max_examples=150, deadline=None)
def test_auto_buckets_pad_no_more_than_quantile_buckets(counts, k):
    auto, quantiles = choose_boundaries(counts, k), quantile_boundaries(counts, k)
    assert padded_elements(counts, auto) <= padded_elements(counts, quantiles)


def test_on_long_tailed_lengths_auto_buckets_beat_quantiles_clearly_and_fast():
    counts = lognormal_counts()
    start = time.perf_counter()
    chosen = choose_boundaries(counts, 8)
    assert time.perf_counter() - start < 1.0  # ~1,000 distinct lengths up to 2000
    assert len(chosen) == 7
    auto, quant = expected_efficiency(counts, chosen), expected_efficiency(counts, quantile_boundaries(counts, 8))
    assert auto > quant + 0.2
    assert expected_efficiency(counts, choose_boundaries(counts, 32)) > 0.93


def test_every_distinct_length_its_own_bucket_pads_nothing():
    counts = np.array([0, 3, 0, 2, 5])
    chosen = choose_boundaries(counts, 10)
    assert chosen == (2, 4)  # one bucket per distinct length: 1, 3, 4
    assert expected_efficiency(counts, chosen) == 1.0


def test_padded_elements_pads_each_example_to_its_buckets_longest():
    counts = np.array([0, 4, 0, 1, 0, 0, 2])  # lengths 1 x4, 3 x1, 6 x2
    assert padded_elements(counts, [2]) == 4 * 1 + 3 * 6
    assert padded_elements(counts, [4]) == 5 * 3 + 2 * 6
    assert choose_boundaries(counts, 2) == (2,)  # 22 < 27


def test_quantile_boundaries_split_counts_evenly():
    counts = np.bincount(np.arange(1, 101))  # lengths 1..100 once each
    assert quantile_boundaries(counts, 4) == (26, 51, 76)
