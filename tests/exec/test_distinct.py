"""exec/distinct.py, the distinct-keys check segment and check share: the same repeats by id for any chunking and
budget, a retried chunk counted once, hash collisions confirmed away on the values."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from conftest import write_parquet_shards
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.runner import SERIAL, Threads
from batchtool.exec import distinct
from batchtool.exec.distinct import KeyPairs, key_pairs
from batchtool.io.inputs import open_dataset
from batchtool.io.workspace import Workspace
from batchtool.ops.regroup import Repeat


def written(directory: str, budget: int, hashes: np.ndarray, cuts: list[int]) -> KeyPairs:
    """Pairs of example ids 0.. with these hashes, written a chunk per slice between the cuts."""
    pairs = key_pairs(Workspace(directory, "out"), budget)
    bounds = [0, *cuts, len(hashes)]
    for index, (a, b) in enumerate(zip(bounds, bounds[1:])):
        pairs.write(index, hashes[a:b], np.arange(a, b, dtype=np.uint64))
    return pairs


def expected(hashes: np.ndarray, limit: int) -> tuple[int, list[int], list[int]]:
    """Every row whose hash a smaller id has (count, the first `limit` ids, each with the first id of its hash)."""
    _, first_index, counts = np.unique(hashes, return_index=True, return_counts=True)
    ids = np.setdiff1d(np.arange(len(hashes)), first_index)[:limit]
    return len(hashes) - len(counts), ids.tolist(), [int(np.flatnonzero(hashes == hashes[i])[0]) for i in ids]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=300), st.integers(1, 4), st.integers(0, 8), st.data())
def test_candidates_are_every_repeat_by_id_for_any_chunking(values, chunks, limit, data):
    """Hashes spread over the partitions, cut into chunks anywhere: the repeats by id, as brute force finds them."""
    hashes = np.array([v * 0x9E3779B97F4A7C15 % 2**64 for v in values], np.uint64)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), min_size=chunks - 1, max_size=chunks - 1)))
    with tempfile.TemporaryDirectory() as directory:
        found = written(directory, 1 << 30, hashes, cuts).candidates(SERIAL, limit)
    count, ids, first_ids = expected(hashes, limit)
    assert (found.count, found.ids.tolist(), found.first_ids.tolist()) == (count, ids, first_ids)


@pytest.mark.parametrize("budget", [1 << 30, 1])
def test_a_small_budget_splits_the_search_and_finds_the_same(tmp_path, budget, monkeypatch):
    """With a budget of one byte every partition is a task of its own (256), each holding 1/256 of the pairs."""
    gen = np.random.default_rng(0)
    n = 5000
    hashes = gen.integers(0, 2 ** 63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    hashes[gen.choice(n, 300, replace=False)] = hashes[gen.choice(n, 300)]
    spans: list[tuple[int, int]] = []
    task = distinct._candidates
    monkeypatch.setattr(distinct, "_candidates", lambda files, limit, span: spans.append(span) or task(files, limit, span))
    found = written(str(tmp_path), budget, hashes, list(range(700, n, 700))).candidates(Threads(2), 10)
    count, ids, first_ids = expected(hashes, 10)
    assert (found.count, found.ids.tolist(), found.first_ids.tolist()) == (count, ids, first_ids)
    assert sorted(spans) == [(p, p + step) for step in [1 if budget == 1 else 16] for p in range(0, 256, step)]


def test_a_retried_chunk_counts_once(tmp_path):
    """A chunk written again (its task retried) replaces its first file."""
    hashes = np.array([5, 6, 5, 7], np.uint64) << np.uint64(40)
    pairs = written(str(tmp_path), 1 << 30, hashes, [2])
    pairs.write(1, hashes[2:], np.arange(2, 4, dtype=np.uint64))
    assert pairs.candidates(SERIAL, 5).ids.tolist() == [2]
    assert sorted(os.listdir(pairs.directory)) == ["c000000000.u64", "c000000001.u64"]


def test_a_hash_collision_between_different_values_is_not_a_repeat(tmp_path):
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"key": ["x", "y", "x"], "n": [1, 2, 3]}), shards=1)
    data = open_dataset(src)
    pairs = key_pairs(Workspace(str(tmp_path), "out"), 1 << 30)
    pairs.write(0, np.array([7, 7], np.uint64), np.array([0, 1], np.uint64))  # x and y: a forced collision
    assert pairs.repeats(data, ["key"], SERIAL, 1) == (0, [])
    pairs.write(1, np.array([7], np.uint64), np.array([2], np.uint64))
    assert pairs.repeats(data, ["key"], SERIAL, 1, ["n"]) == (1, [Repeat(2, 0, {"key": "x", "n": 3})])


def test_many_hash_collisions_are_confirmed_away_in_rounds(tmp_path):
    """149 candidates, none a repeat: the search asks for more until every one is refuted."""
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"key": [f"k{i}" for i in range(150)]}), shards=1)
    pairs = written(str(tmp_path), 1 << 30, np.full(150, 7, np.uint64), [50, 100])
    assert pairs.repeats(open_dataset(src), ["key"], Threads(2), 2) == (0, [])
