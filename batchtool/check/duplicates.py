"""Rows whose key repeats an earlier row's, found in bounded memory from 64-bit hashes.

(hash, example id) pairs stay in memory up to a budget; past it they are partitioned by the
hash's top bits into temporary files, so every copy of a key lands in the same partition and
each partition is sorted on its own. Hash groups are candidates: the caller confirms the ones
it reports with the real values (a 64-bit collision is rare, never impossible).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from batchtool import fs
from batchtool.spill import make_temporary_dir, temporary_write_errors

PAIR_BYTES = 16
SORT_FACTOR = 4
"""Finding repeats needs about this many times the pairs' bytes (sort order, sorted copies, masks)."""
PARTITION_BITS = 8
_SHIFT = np.uint64(64 - PARTITION_BITS)


@dataclass(frozen=True)
class Repeats:
    """How many rows repeat an earlier row's hash, and the first of them by id with the id they repeat."""

    count: int
    ids: np.ndarray
    first_ids: np.ndarray


class HashIndex:
    """Collects (hash, id) pairs of one key in the order given; `repeats()` finds the repeated hashes."""

    def __init__(self, budget_bytes: int, tmp_dir: str | None = None) -> None:
        self.limit_pairs = max(1024, budget_bytes // (PAIR_BYTES * SORT_FACTOR))
        self.tmp_dir = tmp_dir
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
        return os.path.join(self.directory, f"part-{part:03d}.u64")

    def _spill(self) -> None:
        """Append the buffered pairs to their partition files (interleaved hash, id uint64s)."""
        if self.directory is None:
            self.directory = make_temporary_dir("batchtool-check-", self.tmp_dir)
        hashes, ids = self._take_buffer()
        parts = (hashes >> _SHIFT).astype(np.int64)
        order = np.argsort(parts, kind="stable")
        pairs = np.stack([hashes[order], ids[order]], axis=1)
        bounds = np.searchsorted(parts[order], np.arange((1 << PARTITION_BITS) + 1))
        for part in np.flatnonzero(np.diff(bounds)):
            with temporary_write_errors(self.tmp_dir), open(self._path(int(part)), "ab") as f:
                pairs[bounds[part]:bounds[part + 1]].tofile(f)

    def repeats(self, limit: int) -> Repeats:
        """Rows whose hash an earlier row (smaller id) has; the first `limit` by id, with that earlier row."""
        if not self.spilled:
            hashes, ids = self._take_buffer()
            self.add(hashes, ids)  # kept, as one array, for the next call
            return _repeats(hashes, ids, limit)
        if self._buffered:
            self._spill()
        found = []
        for part in range(1 << PARTITION_BITS):
            if os.path.exists(self._path(part)):
                pairs = np.fromfile(self._path(part), dtype=np.uint64).reshape(-1, 2)
                found.append(_repeats(pairs[:, 0], pairs[:, 1], limit))
        ids = np.concatenate([r.ids for r in found]) if found else np.zeros(0, np.uint64)
        first_ids = np.concatenate([r.first_ids for r in found]) if found else np.zeros(0, np.uint64)
        keep = np.argsort(ids, kind="stable")[:limit]
        return Repeats(sum(r.count for r in found), ids[keep], first_ids[keep])


def _repeats(hashes: np.ndarray, ids: np.ndarray, limit: int) -> Repeats:
    order = np.lexsort((ids, hashes))
    h, i = hashes[order], ids[order]
    starts = np.r_[True, h[1:] != h[:-1]] if len(h) else np.zeros(0, bool)
    repeated = ~starts
    count = int(repeated.sum())
    if not count:
        return Repeats(0, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    group_first = np.maximum.accumulate(np.where(starts, np.arange(len(h)), 0))
    rep_ids, rep_first = i[repeated], i[group_first[repeated]]
    keep = np.argsort(rep_ids, kind="stable")[:limit]
    return Repeats(count, rep_ids[keep], rep_first[keep])
