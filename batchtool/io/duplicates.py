"""Rows whose key repeats an earlier row's, found in bounded memory from 64-bit hashes (`check`'s unique
keys and rows, `segment`'s unique example keys).

(hash, example id) pairs stay in memory up to a budget; past it they are partitioned by the
hash's top bits into temporary files, so every copy of a key lands in the same partition and
each partition is sorted on its own. Hash groups are candidates: the caller confirms the ones
it reports with the real values (a 64-bit collision is rare, never impossible). Segment's key check
(ops/segment/chunks.py) partitions the same way (`by_partition`), but writes each chunk's pairs as one file of
every partition (`write_partitioned`, `read_partitions`), so both find the same collisions in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from batchtool.core import fs
from batchtool.io.spill import make_temporary_dir, temporary_write_errors

PAIR_BYTES = 16
SORT_FACTOR = 4
"""Finding repeats needs about this many times the pairs' bytes (sort order, sorted copies, masks)."""
PARTITION_BITS = 8
PARTITIONS = 1 << PARTITION_BITS
_SHIFT = np.uint64(64 - PARTITION_BITS)


@dataclass(frozen=True)
class Repeats:
    """How many rows repeat an earlier row's hash, and the first of them by id with the id they repeat."""

    count: int
    ids: np.ndarray
    first_ids: np.ndarray


class HashIndex:
    """Collects (hash, id) pairs of one key in the order given; `repeats()` finds the repeated hashes."""

    def __init__(self, budget_bytes: int, tmp_dir: str | None = None, prefix: str = "batchtool-check-") -> None:
        self.limit_pairs = max(1024, budget_bytes // (PAIR_BYTES * SORT_FACTOR))
        self.tmp_dir = tmp_dir
        self.prefix = prefix
        self.directory: str | None = None
        self._hashes: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []
        self._buffered = 0

    def __enter__(self) -> HashIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.directory is not None:
            fs.remove_tree(self.directory)
            self.directory = None

    @property
    def spilled(self) -> bool:
        return self.directory is not None

    def add(self, hashes: np.ndarray, ids: np.ndarray) -> None:
        self._hashes.append(np.asarray(hashes, dtype=np.uint64))
        self._ids.append(np.asarray(ids, dtype=np.uint64))
        self._buffered += len(hashes)
        if self._buffered > self.limit_pairs:
            self._spill()

    def _take_buffer(self) -> tuple[np.ndarray, np.ndarray]:
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.uint64)
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.uint64)
        self._hashes, self._ids, self._buffered = [], [], 0
        return hashes, ids

    def _path(self, part: int) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, partition_name(part))

    def _spill(self) -> None:
        """Append the buffered pairs to their partition files."""
        if self.directory is None:
            self.directory = make_temporary_dir(self.prefix, self.tmp_dir)
        for part, pairs in partitioned(*self._take_buffer()):
            with temporary_write_errors(self.tmp_dir), open(self._path(part), "ab") as f:
                pairs.tofile(f)

    def partitions(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The (hashes, ids) collected so far, one hash partition at a time, in hash-prefix order (one part
        when nothing was spilled): every copy of a hash is in the same one."""
        if not self.spilled:
            hashes, ids = self._take_buffer()
            self.add(hashes, ids)  # kept, as one array, for the next call
            yield hashes, ids
            return
        if self._buffered:
            self._spill()
        for part in range(PARTITIONS):
            if os.path.exists(self._path(part)):
                yield read_pairs([self._path(part)])

    def repeats(self, limit: int) -> Repeats:
        """Rows whose hash an earlier row (smaller id) has; the first `limit` by id, with that earlier row."""
        found = [_repeats(hashes, ids, limit) for hashes, ids in self.partitions()]
        ids = np.concatenate([r.ids for r in found])
        first_ids = np.concatenate([r.first_ids for r in found])
        keep = np.argsort(ids, kind="stable")[:limit]
        return Repeats(sum(r.count for r in found), ids[keep], first_ids[keep])

    def collisions(self) -> Iterator[tuple[int, int]]:
        """(id of a hash's first row, id of a later row with it) for every repeat, in hash order, then id order."""
        for hashes, ids in self.partitions():
            first_ids, repeat_ids = repeated(hashes, ids)
            yield from zip(first_ids.tolist(), repeat_ids.tolist())


def by_partition(hashes: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs as interleaved (hash, id) uint64s, by partition (the hash's top PARTITION_BITS bits) and otherwise
    in the order given, and where each partition starts (PARTITIONS + 1 bounds, in pairs)."""
    parts = (hashes >> _SHIFT).astype(np.int64)
    order = np.argsort(parts, kind="stable")
    return (np.stack([hashes[order], ids[order]], axis=1),
            np.searchsorted(parts[order], np.arange(PARTITIONS + 1)).astype(np.uint64))


def partitioned(hashes: np.ndarray, ids: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """The pairs by partition, in partition order: each non-empty one as its file holds them (by_partition)."""
    pairs, bounds = by_partition(hashes, ids)
    for part in np.flatnonzero(np.diff(bounds)):
        yield int(part), pairs[bounds[part]:bounds[part + 1]]


_BOUNDS_BYTES = (PARTITIONS + 1) * 8


def write_partitioned(path: str, hashes: np.ndarray, ids: np.ndarray) -> None:
    """The pairs of every partition in one file: the bounds (by_partition), then the pairs, so a task reads the
    partitions it checks without the others (read_partitions); one file where a file per partition made hundreds
    of tiny ones per chunk."""
    pairs, bounds = by_partition(np.asarray(hashes, dtype=np.uint64), np.asarray(ids, dtype=np.uint64))
    with open(path, "wb") as f:
        bounds.tofile(f)
        pairs.tofile(f)


def read_partitions(path: str, first: int, last: int) -> list[np.ndarray]:
    """Partitions [first, last) of a write_partitioned file, each as (n, 2) pairs."""
    with open(path, "rb") as f:
        bounds = np.fromfile(f, dtype=np.uint64, count=PARTITIONS + 1).astype(np.int64)
        f.seek(_BOUNDS_BYTES + int(bounds[first]) * PAIR_BYTES)
        pairs = np.fromfile(f, dtype=np.uint64, count=2 * int(bounds[last] - bounds[first])).reshape(-1, 2)
    return [pairs[bounds[p] - bounds[first]:bounds[p + 1] - bounds[first]] for p in range(first, last)]


def partition_name(part: int) -> str:
    """The file name of a partition's pairs."""
    return f"part-{part:03d}.u64"


def read_pairs(paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The (hashes, ids) of partition files, concatenated in the order given."""
    pairs = [np.fromfile(path, dtype=np.uint64).reshape(-1, 2) for path in paths]
    both = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.uint64)
    return both[:, 0], both[:, 1]


def repeated(hashes: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first id of its hash, id) of every row whose hash a row of smaller id has, in (hash, id) order."""
    order = np.lexsort((ids, hashes))
    h, i = hashes[order], ids[order]
    starts = np.r_[True, h[1:] != h[:-1]] if len(h) else np.zeros(0, bool)
    group_first = np.maximum.accumulate(np.where(starts, np.arange(len(h)), 0))
    later = ~starts
    return i[group_first[later]], i[later]


def _repeats(hashes: np.ndarray, ids: np.ndarray, limit: int) -> Repeats:
    rep_first, rep_ids = repeated(hashes, ids)
    keep = np.argsort(rep_ids, kind="stable")[:limit]
    return Repeats(len(rep_ids), rep_ids[keep], rep_first[keep])
