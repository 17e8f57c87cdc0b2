"""Spill files: every row comes back once, in its group, in a keyed random order independent of chunking."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from batchtool.core import rng
from batchtool.io import spill as spill_mod
from batchtool.io.dataset import Chunk
from batchtool.io.spill import ID_COLUMN, Spill, interleave


def chunks_of(n: int, size: int) -> list[Chunk]:
    return [Chunk(pa.record_batch({"x": pa.array(np.arange(i, min(n, i + size)))}),
                  rng.example_ids(0, i, min(n, i + size) - i)) for i in range(0, n, size)]


def spill_and_read(n: int, chunk_size: int, parts: list[int], tmp_path) -> list[list[int]]:
    with Spill(pa.schema([("x", pa.int64())]), parts, seed=3, stage="t", tmp_dir=str(tmp_path)) as spill:
        for c in chunks_of(n, chunk_size):
            spill.add(c, c.data.column("x").to_numpy() % len(parts))
        spill.finish()
        return [[v for ch in spill.read_group(g) for v in ch.data.column("x").to_pylist()]
                for g in range(len(parts))]


def test_every_row_returns_once_in_its_group(tmp_path):
    groups = spill_and_read(1000, 37, [1, 3, 2], tmp_path)
    for g, values in enumerate(groups):
        assert sorted(values) == list(range(g, 1000, 3))
    assert os.listdir(tmp_path) == []  # removed on close


def test_order_does_not_depend_on_chunk_size(tmp_path):
    assert spill_and_read(500, 7, [2, 4], tmp_path) == spill_and_read(500, 500, [2, 4], tmp_path)


@pytest.mark.parametrize("parts", [1, 3, 16])
def test_a_group_comes_back_sorted_by_its_key_whatever_the_parts(tmp_path, parts):
    """Parts are ranges of the order key, so --memory (which sets the parts) never changes the order."""
    (values,) = spill_and_read(200, 50, [parts], tmp_path)
    keys = rng.permutation_keys(3, "t", rng.example_ids(0, 0, 200))
    assert values == list(np.argsort(keys))


def test_groups_of_different_parts_each_come_back_in_key_order(tmp_path):
    ids = rng.example_ids(0, 0, 600)
    keys = rng.permutation_keys(3, "t", ids)
    for parts in ([1, 5], [4, 2]):
        groups = spill_and_read(600, 64, parts, tmp_path)
        for g, values in enumerate(groups):
            mine = np.arange(g, 600, 2)
            assert values == mine[np.argsort(keys[mine])].tolist()


def test_unordered_read_keeps_the_order_rows_were_added(tmp_path):
    with Spill(pa.schema([("x", pa.int64())]), [1], seed=3, stage="t", tmp_dir=str(tmp_path)) as spill:
        for c in chunks_of(100, 7):
            spill.add(c, np.zeros(c.num_rows, dtype=np.int64))
        spill.finish()
        assert [v for ch in spill.read_group(0, ordered=False) for v in ch.data.column("x").to_pylist()] \
            == list(range(100))


def test_a_user_column_named_like_the_id_column_survives(tmp_path):
    """Ids are the last column of a spill file, found by position: an input column of the same name is data."""
    schema = pa.schema([(ID_COLUMN, pa.string()), ("x", pa.int64())])
    chunk = Chunk(pa.record_batch([pa.array(["a", "b", "c"]), pa.array([1, 2, 3])], schema=schema),
                  rng.example_ids(2, 0, 3))
    with Spill(schema, [2], seed=1, stage="t", tmp_dir=str(tmp_path)) as spill:
        spill.add(chunk, np.zeros(3, dtype=np.int64))
        spill.finish()
        back = Chunk.concat(list(spill.read_group(0)), schema)
    assert back.data.schema == schema
    assert sorted(zip(back.data.column(ID_COLUMN).to_pylist(), back.ids.tolist())) == \
        list(zip(["a", "b", "c"], chunk.ids.tolist()))


def test_scatter_shuffle_is_uniform(tmp_path):
    """Position of element 0 over many seeds is uniform (chi-square), with several parts."""
    positions = Counter()
    for seed in range(400):
        with Spill(pa.schema([("x", pa.int64())]), [3], seed=seed, stage="t", tmp_dir=str(tmp_path)) as spill:
            for c in chunks_of(8, 8):
                spill.add(c, np.zeros(8, dtype=np.int64))
            spill.finish()
            order = [v for ch in spill.read_group(0) for v in ch.data.column("x").to_pylist()]
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


def test_many_cells_keep_few_files_open_and_lose_nothing(tmp_path, monkeypatch):
    """A small budget makes thousands of (group, part) cells: only MAX_OPEN_WRITERS files are open at once,
    and a cell whose file was closed continues in a new one, read back in order."""
    monkeypatch.setattr(spill_mod, "MAX_OPEN_WRITERS", 3)
    open_files = []
    with Spill(pa.schema([("x", pa.int64())]), [4] * 10, seed=3, stage="t", tmp_dir=str(tmp_path),
               flush_bytes=1) as spill:
        before = len(os.listdir("/proc/self/fd"))
        for c in chunks_of(2000, 50):
            spill.add(c, c.data.column("x").to_numpy() % 10)
            open_files.append(len(os.listdir("/proc/self/fd")) - before)
        spill.finish()
        assert max(open_files) <= 3
        assert len(os.listdir(spill.cells.directory)) > 40 * 3  # cells reopened in new files
        ids = rng.example_ids(0, 0, 2000)
        keys = rng.permutation_keys(3, "t", ids)
        for g in range(10):
            mine = np.arange(g, 2000, 10)
            assert [v for ch in spill.read_group(g) for v in ch.data.column("x").to_pylist()] == \
                mine[np.argsort(keys[mine])].tolist()
