"""The order of many keys (integers or strings) by value, then by position, in bounded memory: runs sorted in
memory, spilled to files once they outgrow the budget, and merged a few at a time (an external merge sort)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

COPIES = 3
"""A run is held about three times while it is sorted (its keys and positions, the sort's indices, the sorted copy):
a run's keys and positions take at most a third of the budget."""
WAYS = 16
"""Runs merged at once; more are merged in passes. Each holds one block (of a third of the budget / WAYS)."""


def _order(keys: pa.Array) -> np.ndarray:
    """The stable sort of `keys` (int64 or large_string): positions of equal keys keep their order."""
    if pa.types.is_integer(keys.type):
        return np.argsort(keys.to_numpy(), kind="stable")
    return pc.sort_indices(keys).to_numpy().astype(np.int64)  # a stable sort


def search(value: Callable[[int], Any], n: int, key: Any, right: bool) -> int:
    """Where `key` goes among n sorted values (`value(i)`, each read once at most: a binary search, numpy's
    searchsorted left or right) in O(log n) reads."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        v = value(mid)
        if v < key or (right and v == key):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _bound(keys: pa.Array, key: Any, right: bool) -> int:
    """Where `key` goes in the sorted `keys` (numpy's searchsorted, left or right)."""
    if pa.types.is_integer(keys.type):
        return int(np.searchsorted(keys.to_numpy(), key, "right" if right else "left"))
    return search(lambda i: keys[i].as_py(), len(keys), key, right)


def _entry_bytes(keys: pa.Array) -> float:
    """Bytes a key and its position take in a run, on average."""
    return keys.nbytes / max(1, len(keys)) + 8


class _Run:
    """A spilled run read back a block at a time, sequentially (read, not memory-mapped: what was merged is freed)."""

    def __init__(self, path: str) -> None:
        self._file = pa.OSFile(path)
        self._reader = pa.ipc.open_stream(self._file)
        self.keys: pa.Array | None = None
        self.positions = np.zeros(0, dtype=np.int64)
        self.done = False
        self.load()

    def load(self) -> None:
        """The next block, once the last is used up (done: there is none)."""
        while True:
            try:
                block = self._reader.read_next_batch()
            except StopIteration:
                self.done, self.keys = True, None
                self._file.close()
                return
            if block.num_rows:
                self.keys, self.positions = block.column(0), block.column(1).to_numpy()
                return

    def take(self, n: int) -> tuple[pa.Array, np.ndarray]:
        """The first n keys and positions of the block, dropped from it."""
        keys, positions = self.keys.slice(0, n), self.positions[:n]
        self.keys, self.positions = self.keys.slice(n), self.positions[n:]
        return keys, positions


def _merge(paths: list[str]) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """The keys and positions of sorted runs (each of positions beyond the one before it) in one order: by key, then
    by run and position, in pieces. A step takes every key up to the smallest last key of the blocks held (ties: up
    to that block's run), so each step uses up at least that block."""
    runs = [_Run(p) for p in paths]
    while True:
        live = [i for i, r in enumerate(runs) if not r.done]
        if not live:
            return
        limit, last = min((runs[i].keys[len(runs[i].keys) - 1].as_py(), i) for i in live)
        keys, positions = [], []
        for i in live:
            run = runs[i]
            n = _bound(run.keys, limit, right=i <= last)
            if n:
                k, p = run.take(n)
                keys.append(k)
                positions.append(p)
            if not len(run.keys):
                run.load()
        if keys:
            merged = pa.concat_arrays(keys)
            order = _order(merged)
            yield merged.take(pa.array(order)), np.concatenate(positions)[order]


class KeySort:
    """Keys added in position order (0, 1, ...), given back as positions in key order; under `budget` bytes, runs
    spill as Arrow IPC streams into `directory` (which the caller removes), written under `errors`."""

    def __init__(self, directory: str, budget: int, errors: Callable[[], AbstractContextManager[None]]) -> None:
        self.directory, self.budget, self._errors = directory, budget, errors
        self._held: list[pa.Array] = []
        self._held_bytes = 0
        self._start = 0
        """The position of the first key held."""
        self._runs: list[str] = []
        self._files = 0

    def add(self, keys: pa.Array) -> None:
        """The keys of the next positions."""
        if not len(keys):
            return
        self._held.append(keys)
        self._held_bytes += keys.nbytes + 8 * len(keys)
        if self._held_bytes * COPIES > self.budget:
            self._spill()

    def _sorted(self) -> tuple[pa.Array, np.ndarray]:
        keys = pa.concat_arrays(self._held)
        order = _order(keys)
        self._held, self._held_bytes = [], 0
        positions = order + self._start
        self._start += len(keys)
        return keys.take(pa.array(order)), positions

    def _block_rows(self, keys: pa.Array) -> int:
        return max(1, int(self.budget / (COPIES * WAYS) / _entry_bytes(keys)))

    def _write_run(self, pieces: Iterator[tuple[pa.Array, np.ndarray]]) -> str:
        """A run file of sorted pieces, in blocks of _block_rows."""
        path = os.path.join(self.directory, f"run-{self._files:06d}.arrow")
        self._files += 1
        with self._errors(), pa.OSFile(path, "wb") as sink:
            writer = None
            for keys, positions in pieces:
                table = pa.table({"key": keys, "position": pa.array(positions, pa.int64())})
                if writer is None:
                    writer = pa.ipc.new_stream(sink, table.schema)
                writer.write_table(table, max_chunksize=self._block_rows(keys))
            if writer is not None:
                writer.close()
        return path

    def _merged(self, runs: list[str]) -> str:
        """One run of several, whose files are removed (the disk holds the keys about once)."""
        path = self._write_run(_merge(runs))
        for run in runs:
            os.remove(run)
        return path

    def _spill(self) -> None:
        self._runs.append(self._write_run(iter([self._sorted()])))

    def positions(self) -> Iterator[np.ndarray]:
        """Every position added, in key order (equal keys in position order), in pieces: from memory when all of
        them fit, else merged from the runs, in passes of WAYS runs."""
        if not self._runs:
            if self._held:
                yield self._sorted()[1]
            return
        if self._held:
            self._spill()
        runs = self._runs
        while len(runs) > WAYS:
            runs = [self._merged(runs[i:i + WAYS]) for i in range(0, len(runs), WAYS)]
        for _, positions in _merge(runs):
            yield positions


__all__ = ["KeySort", "search"]
