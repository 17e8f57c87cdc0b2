"""key_sort: keys ordered by value then position, whatever the budget (in memory, one merge, merges in passes)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings, strategies as st

from batchtool.io import key_sort
from batchtool.io.key_sort import KeySort


def sorted_positions(keys: pa.Array, budget: int, pieces: list[int], directory: str) -> np.ndarray:
    sort = KeySort(directory, budget, contextlib.nullcontext)
    start = 0
    for size in pieces:
        sort.add(keys.slice(start, size))
        start += size
    sort.add(keys.slice(start))
    return np.concatenate([np.zeros(0, dtype=np.int64), *sort.positions()])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-4, 4), max_size=300), strings=st.booleans(),
       budget=st.sampled_from([1, 200, 2_000, 1 << 20]), pieces=st.lists(st.integers(0, 40), max_size=20))
def test_positions_are_a_stable_sort_of_the_keys(tmp_path_factory, values, strings, budget, pieces):
    """Small budgets: runs of a few keys, blocks of one or two (many merge steps, ties across blocks)."""
    keys = pa.array([f"k{v}" * (abs(v) + 1) for v in values] if strings else values,
                    pa.large_string() if strings else pa.int64())
    want = pc.sort_indices(keys).to_numpy() if strings else np.argsort(keys.to_numpy(), kind="stable")
    directory = str(tmp_path_factory.mktemp("runs"))
    assert sorted_positions(keys, budget, pieces, directory).tolist() == want.tolist()


def test_runs_beyond_the_ways_are_merged_in_passes_and_removed(tmp_path):
    keys = pa.array(np.random.default_rng(0).integers(0, 50, 5_000), pa.int64())
    got = sorted_positions(keys, 3 * 16 * 40, [37] * 135, str(tmp_path))  # a run every 40 keys or so: > WAYS ** 1
    assert got.tolist() == np.argsort(keys.to_numpy(), kind="stable").tolist()
    assert len(os.listdir(tmp_path)) <= key_sort.WAYS  # merged passes leave one file per group
