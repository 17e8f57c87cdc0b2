"""The local engine keeps an exchange in memory while it fits its share of --memory (batchtool.exec.held): no file in the
workspace then, spill files beyond it, and the same bytes either way."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE, data_bytes

import memlimit
from batchtool.core import fs, rng
from batchtool.io.dataset import Chunk
from batchtool.exec.held import HELD_SHARE, HeldCells, Pool
from batchtool.io.spill import Spill, SpillFiles, temporary_write_errors

PARQUET = os.path.join(SAMPLE, "parquet")
RUNS = {
    "bucket": ["bucket", "--auto-buckets", "3", "--batch-size", "8", "--seed", "1"],
    "shuffle": ["shuffle", "--seed", "2"],
    "stratify": ["stratify", "--target", "uniform", "--batch-size", "8", "--balanced-batches", "--seed", "3"],
    "pack": ["pack", "--max-length", "512", "--sequence", "tokens", "--batch-size", "8", "--seed", "4"],
}


@pytest.fixture
def workspace_files(monkeypatch) -> list[str]:
    """The files each removed tree held when it was removed (every workspace is removed at the end of its run,
    with whatever its tasks wrote)."""
    seen: list[str] = []
    remove = fs.remove_tree

    def recorded(path: str) -> None:
        seen.extend(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names)
        remove(path)

    monkeypatch.setattr(fs, "remove_tree", recorded)
    return seen


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_exchange_that_fits_writes_no_file_and_one_that_does_not_spills_the_same_bytes(
        run_cli, tmp_path, workspace_files, name):
    outputs = {}
    for memory in ("1GB", "256KB"):
        workspace_files.clear()
        dst, tmp = tmp_path / memory, tmp_path / f"tmp-{memory}"
        result = run_cli(RUNS[name][0], PARQUET, dst, *RUNS[name][1:], "--memory", memory, "--tmp-dir", tmp,
                         "--threads", "2", "-q")
        assert result.exit_code == 0, result.stderr
        assert os.listdir(tmp) == []
        spilled = [path for path in workspace_files if path.startswith(str(tmp))]
        if memory == "1GB":
            assert spilled == []
        else:
            assert any(os.path.basename(os.path.dirname(path)).startswith("m") for path in spilled), spilled
        outputs[memory] = data_bytes(str(dst))
    assert outputs["1GB"] == outputs["256KB"]


def _chunks(n: int, size: int) -> list[Chunk]:
    return [Chunk(pa.record_batch({"x": pa.array(np.arange(i, min(n, i + size)))}),
                  rng.example_ids(0, i, min(n, i + size) - i)) for i in range(0, n, size)]


def _spilled(tmp_path, name: str, limit: int | None) -> tuple[list[list[int]], Spill]:
    """Rows scattered to 3 groups of 2 parts and read back, through cells held in a pool of `limit` bytes (None:
    straight to files)."""
    directory = str(tmp_path / name)

    def files(schema: pa.Schema) -> SpillFiles:
        os.mkdir(directory)
        return SpillFiles(directory, schema, lambda: temporary_write_errors(None))

    pool = None if limit is None else Pool(limit)
    cells = files if pool is None else (lambda schema: HeldCells(pool, files, schema))
    spill = Spill(pa.schema([("x", pa.int64())]), [2, 2, 2], seed=5, stage="t", flush_bytes=256, cells=cells)
    for chunk in _chunks(3000, 97):
        spill.add(chunk, chunk.data.column("x").to_numpy() % 3)
    spill.finish()
    groups = [[v for c in spill.read_group(g) for v in c.data.column("x").to_pylist()] for g in range(3)]
    return groups, spill


def test_cells_held_until_the_pool_refuses_then_all_spill_in_order(tmp_path):
    """Past its pool, a map's held cells go to files first and the rest follow: every group reads back as the
    files alone give it; the pool is never exceeded, and gets every byte back."""
    expected, plain = _spilled(tmp_path, "files", None)
    plain.close()
    held, spill = _spilled(tmp_path, "all", 1 << 30)
    assert held == expected and spill.cells.files is None and not os.path.exists(tmp_path / "all")
    spill.close()
    over, spill = _spilled(tmp_path, "over", 4096)
    assert over == expected and spill.cells.files is not None and os.listdir(tmp_path / "over")
    assert spill.cells.pool.most <= 4096
    spill.close()
    assert spill.cells.pool.held == 0 and not os.path.exists(tmp_path / "over")


def test_a_shuffle_held_in_memory_stays_within_its_budget(tmp_path):
    """61 MB of rows shuffled under --memory 288MB, whose share (72 MB) holds them all: the process stays within
    --memory of what the same command takes on ten rows."""
    rows, steps = 16_000, 1_000
    frames = pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * steps),
                                      pa.array(np.random.default_rng(0).standard_normal(rows * steps, np.float32)))
    table = pa.table({"key": np.arange(rows), "frames": frames})
    assert table.nbytes < (288 << 20) // HELD_SHARE
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=1_000)
    pq.write_table(table.slice(0, 10), tmp_path / "small.parquet")
    cap = 2 << 30
    peaks = {}
    for name in ("small", "big"):
        done = memlimit.batchtool("shuffle", tmp_path / f"{name}.parquet", tmp_path / f"out-{name}",
                                  "--memory", "288MB", "--threads", "2", "-q", limit_bytes=cap)
        assert done.returncode == 0, done.stderr
        peaks[name] = done.peak_bytes
    assert peaks["big"] - peaks["small"] <= 288 << 20, peaks
