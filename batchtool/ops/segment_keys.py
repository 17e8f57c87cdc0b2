"""segment's duplicate-key check: every example key must be unique, checked in bounded memory from the keys'
64-bit hashes (check.duplicates.HashIndex, which `check` uses for its unique keys too), a hash match confirmed
by re-reading the two keys."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batchtool.check.duplicates import HashIndex
from batchtool.dataset import Dataset
from batchtool.errors import InputError

CONFIRM_PAIRS = 64
"""Hash matches confirmed per pass over the key column (a pass only happens on a match)."""


def key_index(memory: int, tmp_dir: str | None) -> HashIndex:
    """An index of (key hash, example id) holding a quarter of `memory` (at least 1 MiB) of pairs before it
    spills them to hash partitions under `tmp_dir`."""
    return HashIndex(max(4 << 20, memory), tmp_dir, prefix="batchtool-keys-")


def check_unique_keys(index: HashIndex, dataset: Dataset, key: str, threads: int) -> None:
    """Raise InputError naming the first duplicate key (in hash order) and both rows, after confirming it."""
    batch: list[tuple[int, int]] = []
    for pair in index.collisions():
        batch.append(pair)
        if len(batch) == CONFIRM_PAIRS:
            _confirm(batch, dataset, key, threads)
            batch = []
    if batch:
        _confirm(batch, dataset, key, threads)


def _confirm(pairs: list[tuple[int, int]], dataset: Dataset, key: str, threads: int) -> None:
    """Read the real keys of colliding rows (one more pass over the key column: only on a hash hit)."""
    wanted = np.array(sorted({i for pair in pairs for i in pair}), dtype=np.uint64)
    keys: dict[int, str] = {}
    for chunk in dataset.chunks([key], threads):
        hit = np.isin(chunk.ids, wanted)
        if hit.any():
            values = chunk.data.column(key).filter(pa.array(hit)).to_pylist()
            keys.update(zip(chunk.ids[hit].tolist(), values))
    for a, b in pairs:
        if keys[a] == keys[b]:
            raise InputError(f"duplicate key {keys[a]!r}: {dataset.locate(a)} and {dataset.locate(b)} "
                             "(segment keys must be unique)")


__all__ = ["check_unique_keys", "key_index"]
