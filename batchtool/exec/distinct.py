"""Distinct keys in bounded memory on any engine (segment's unique keys, check's unique and duplicate-row rules):
each chunk's (key hash, example id) pairs written to the run's workspace where the chunk is read, the repeated
hashes found by tasks over hash partitions, the first repeats by id confirmed on the real values.

A chunk's pairs are one file, sorted by partition (the hash's top bits) behind the partitions' bounds, so every copy
of a key falls in the same partition and a task reads only the partitions it checks of every file. How many
partitions a task takes follows from the pairs' bytes and the budget, and the results are merged by example id, so
what is reported never depends on --memory, --threads or the engine. Hash groups are candidates: a 64-bit
collision is rare, never impossible, so a repeat counts only once the values agree.
"""

from __future__ import annotations

import functools
import glob
import os
import uuid
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from batchtool.core import fs
from batchtool.core.runner import Executor
from batchtool.io.dataset import Dataset
from batchtool.io.workspace import Workspace, tasks_executor
from batchtool.ops.regroup import Repeat

PAIR_BYTES = 16
SORT_FACTOR = 4
"""Finding repeats takes about this many times the pairs' bytes (sort order, sorted copies, masks)."""
PARTITION_BITS = 8
PARTITIONS = 1 << PARTITION_BITS
_SHIFT = np.uint64(64 - PARTITION_BITS)
_BOUNDS_BYTES = (PARTITIONS + 1) * 8
MOST_PER_TASK = 16
"""The most partitions one task searches (16 tasks at least: they spread over the workers, and 16 small sorts
take less time than one large one)."""


@dataclass(frozen=True)
class Candidates:
    """Rows whose hash a row of smaller id has: how many, and the first of them by id with the first id of their
    hash."""

    count: int
    ids: np.ndarray
    first_ids: np.ndarray


@dataclass(frozen=True)
class KeyPairs:
    """The pairs of one key, a file per chunk in a directory of the workspace (ops.regroup.DistinctKeys). It
    pickles: `write` runs wherever a chunk is read; `repeats` on the driver, once every chunk is written."""

    space: Workspace
    directory: str
    budget: int
    """Bytes the tasks finding the repeats hold together."""

    def write(self, index: int, hashes: np.ndarray, ids: np.ndarray) -> None:
        """Chunk number `index`'s pairs, published once complete, replacing what a failed earlier attempt of its
        task wrote (a retry never counts twice)."""
        hashes, ids = np.asarray(hashes, np.uint64), np.asarray(ids, np.uint64)
        parts = (hashes >> _SHIFT).astype(np.int64)
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(PARTITIONS + 1)).astype(np.uint64)
        fs.check_shared(self.directory, self.space.name)
        writing = os.path.join(self.directory, f".c{index:09d}-{uuid.uuid4().hex}")
        with self.space.errors():
            with open(writing, "wb") as f:
                bounds.tofile(f)
                np.stack([hashes[order], ids[order]], axis=1).tofile(f)
            os.replace(writing, os.path.join(self.directory, f"c{index:09d}.u64"))

    def candidates(self, executor: Executor, limit: int) -> Candidates:
        """Repeated hashes, found by tasks on the executor (or the driver's threads, where its workers do not
        see the workspace), each over as many partitions as its share of the budget holds."""
        files = sorted(glob.glob(os.path.join(glob.escape(self.directory), "c*.u64")))
        runs = tasks_executor(self.space, executor)
        pairs = sum(os.path.getsize(path) - _BOUNDS_BYTES for path in files) // PAIR_BYTES
        share = self.budget // max(1, runs.shares.tasks)
        fit = min(MOST_PER_TASK, share * PARTITIONS // max(1, pairs * PAIR_BYTES * SORT_FACTOR))
        step = 1 << max(0, fit.bit_length() - 1)
        found = list(runs.map(functools.partial(_candidates, files, limit),
                              [(first, first + step) for first in range(0, PARTITIONS, step)]))
        ids = np.concatenate([c.ids for c in found])
        keep = np.argsort(ids, kind="stable")[:limit]
        return Candidates(sum(c.count for c in found), ids[keep], np.concatenate([c.first_ids for c in found])[keep])

    def repeats(self, data: Dataset, columns: Sequence[str], executor: Executor, limit: int,
                fetch: Sequence[str] = ()) -> tuple[int, list[Repeat]]:
        """Rows whose `columns` hold an earlier row's values: how many, and the first `limit` by id (with their
        `columns` and `fetch` values), each confirmed on the values, which one more pass reads (only on a hash
        hit). A candidate whose values differ is a hash collision and is not counted, so the count is exact
        whenever every candidate got checked (always, short of more than `limit` repeats plus collisions)."""
        target = max(limit, 1)
        read = list(dict.fromkeys([*columns, *fetch]))
        found: list[Repeat] = []
        checked = refuted = 0
        want = target
        while True:
            candidates = self.candidates(executor, want)
            ids, first_ids = candidates.ids[checked:].tolist(), candidates.first_ids[checked:].tolist()
            rows = fetch_rows(data, np.unique(np.array(ids + first_ids, dtype=np.uint64)), read, executor)
            for dup, first in zip(ids, first_ids):
                if [canonical(rows[dup][c]) for c in columns] == [canonical(rows[first][c]) for c in columns]:
                    found.append(Repeat(dup, first, rows[dup]))
                else:
                    refuted += 1
            checked = len(candidates.ids)
            if len(found) >= target or checked >= candidates.count:
                return candidates.count - refuted, found[:limit]
            want *= 2


def key_pairs(space: Workspace, budget: int) -> KeyPairs:
    """A new directory of pairs in the workspace (made with mkdir, never makedirs: a task still running after a
    failed command's cleanup must not recreate the tree)."""
    pairs = KeyPairs(space, os.path.join(space.directory, f"keys-{uuid.uuid4().hex}"), budget)
    with space.errors():
        os.mkdir(pairs.directory)
    return pairs


def _read(path: str, first: int, last: int) -> np.ndarray:
    """Partitions [first, last) of a chunk's pairs, as (n, 2) uint64s."""
    with open(path, "rb") as f:
        bounds = np.fromfile(f, dtype=np.uint64, count=PARTITIONS + 1).astype(np.int64)
        f.seek(_BOUNDS_BYTES + int(bounds[first]) * PAIR_BYTES)
        return np.fromfile(f, dtype=np.uint64, count=2 * int(bounds[last] - bounds[first])).reshape(-1, 2)


def _candidates(files: Sequence[str], limit: int, span: tuple[int, int]) -> Candidates:
    """The task over partitions [first, last) of every chunk's pairs: its repeats, the first `limit` by id."""
    pairs = np.concatenate([_read(path, *span) for path in files] or [np.zeros((0, 2), np.uint64)])
    first_ids, ids = repeated(pairs[:, 0], pairs[:, 1])
    keep = np.argsort(ids, kind="stable")[:limit]
    return Candidates(len(ids), ids[keep], first_ids[keep])


def repeated(hashes: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first id of its hash, id) of every row whose hash a row of smaller id has, in (hash, id) order."""
    order = np.lexsort((ids, hashes))
    h, i = hashes[order], ids[order]
    starts = np.r_[True, h[1:] != h[:-1]] if len(h) else np.zeros(0, bool)
    group_first = np.maximum.accumulate(np.where(starts, np.arange(len(h)), 0))
    later = ~starts
    return i[group_first[later]], i[later]


def fetch_rows(data: Dataset, ids: np.ndarray, columns: Sequence[str], executor: Executor) -> dict[int, dict]:
    """Rows by example id, from one pass over these columns that stops after the last."""
    rows: dict[int, dict] = {}
    if not len(ids):
        return rows
    with closing(data.chunks(columns, executor)) as chunks:
        for chunk in chunks:
            hit = np.isin(chunk.ids, ids)
            if hit.any():
                taken = chunk.filter(hit)
                rows.update(zip(taken.ids.tolist(), taken.data.to_pylist()))
            if len(rows) == len(ids):
                break
    return rows


def canonical(value: object) -> object:
    """A Python value (from to_pylist) as rows are compared: floats by their exact repr, so NaN equals NaN
    and -0.0 differs from 0.0, as their hashes do."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


__all__ = ["Candidates", "KeyPairs", "canonical", "fetch_rows", "key_pairs", "repeated"]
