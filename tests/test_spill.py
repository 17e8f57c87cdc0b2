"""Spill files: every row comes back once, in its group, in a keyed random order independent of chunking."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pyarrow as pa

from batchtool import rng
from batchtool.dataset import Chunk
from batchtool.spill import Spill, interleave


def chunks_of(n: int, size: int) -> list[Chunk]:
    return [Chunk(pa.record_batch({"x": pa.array(np.arange(i, min(n, i + size)))}),
                  rng.example_ids(0, i, min(n, i + size) - i)) for i in range(0, n, size)]


def spill_and_read(n: int, chunk_size: int, parts: list[int], tmp_path) -> list[list[int]]:
    with Spill(pa.schema([("x", pa.int64())]), parts, seed=3, stage="t", tmp_dir=str(tmp_path)) as spill:
        for c in chunks_of(n, chunk_size):
            spill.add(c, c.data.column("x").to_numpy() % len(parts))
        spill.finish()
        return [[v for ch in spill.read_group(g, "order") for v in ch.data.column("x").to_pylist()]
                for g in range(len(parts))]


def test_every_row_returns_once_in_its_group(tmp_path):
    groups = spill_and_read(1000, 37, [1, 3, 2], tmp_path)
    for g, values in enumerate(groups):
        assert sorted(values) == list(range(g, 1000, 3))
    assert os.listdir(tmp_path) == []  # removed on close


def test_order_does_not_depend_on_chunk_size(tmp_path):
    assert spill_and_read(500, 7, [2, 4], tmp_path) == spill_and_read(500, 500, [2, 4], tmp_path)


def test_single_part_order_is_sorted_by_permutation_key(tmp_path):
    (values,) = spill_and_read(200, 50, [1], tmp_path)
    keys = rng.permutation_keys(3, "order", rng.example_ids(0, 0, 200))
    assert values == list(np.argsort(keys))


def test_scatter_shuffle_is_uniform(tmp_path):
    """Position of element 0 over many seeds is uniform (chi-square), with several parts."""
    positions = Counter()
    for seed in range(400):
        with Spill(pa.schema([("x", pa.int64())]), [3], seed=seed, stage="t", tmp_dir=str(tmp_path)) as spill:
            for c in chunks_of(8, 8):
                spill.add(c, np.zeros(8, dtype=np.int64))
            spill.finish()
            order = [v for ch in spill.read_group(0, "o") for v in ch.data.column("x").to_pylist()]
        positions[order.index(0)] += 1
    expected = 400 / 8
    chi2 = sum((positions[i] - expected) ** 2 / expected for i in range(8))
    assert chi2 < 24.3  # 7 dof, p = 0.001


def test_interleave_keeps_stream_order_and_counts():
    streams = [iter(["a1", "a2", "a3"]), iter(["b1"]), iter(["c1", "c2"])]
    merged = list(interleave(streams, [3, 1, 2], seed=1, stage="i"))
    assert [v for _, v in merged if v[0] == "a"] == ["a1", "a2", "a3"]
    assert Counter(i for i, _ in merged) == {0: 3, 1: 1, 2: 2}
    again = list(interleave([iter(["a1", "a2", "a3"]), iter(["b1"]), iter(["c1", "c2"])], [3, 1, 2], 1, "i"))
    assert merged == again
