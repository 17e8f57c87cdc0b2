"""segment's duplicate-key check: every example key must be unique, checked in bounded memory from the keys'
64-bit hashes, a hash match confirmed by re-reading the two keys. The (hash, id) pairs never reach the driver: each
chunk's task writes them to the workspace, partitioned as check.duplicates.HashIndex partitions them (`check`'s
unique keys), and one task per partition finds its repeated hashes there (SharedKeys)."""

from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import fs
from batchtool.check.duplicates import PARTITIONS, partition_name, partitioned, read_pairs, repeated
from batchtool.dataset import Chunk, Dataset
from batchtool.workspace import Workspace
from batchtool.errors import InputError
from batchtool.ops.segment_chunks import Examples, SegmentPlan, prepare_chunk

CONFIRM_PAIRS = 64
"""Hash matches confirmed per pass over the key column (a pass only happens on a match); on a remote engine, also
the most each partition's task returns at a time."""


def prepare_shared(plan: SegmentPlan, locate: Callable[[int], str], space: Workspace,
                   item: tuple[int, Callable[[], Chunk]]) -> Examples:
    """prepare_chunk for chunk number `index`, its rows and key hashes written to the workspace (the rows for the
    tasks that build batches, the hashes for SharedKeys): the examples come back with their numbers only."""
    index, task = item
    examples = prepare_chunk(plan, locate, task)
    assert examples.key_hash is not None
    own = write_pairs(space, index, examples.key_hash, examples.ids, examples.with_keys())
    return replace(examples.kept_at(os.path.join(own, EXAMPLES_FILE)), key_hash=None)


EXAMPLES_FILE = "examples.arrow"
"""A chunk's rows and keys in its directory (Examples.stored), read where its batches are built."""


def write_pairs(space: Workspace, index: int, hashes: np.ndarray, ids: np.ndarray,
                rows: pa.RecordBatch | None = None) -> str:
    """Chunk number `index`'s pairs as partition files (and its `rows`, for the tasks that build batches) in a
    directory of its own, published as c<index> once complete (replacing what a failed earlier attempt of the
    task left, so a retry never counts twice); returns it. Made with mkdir, never makedirs: a task still
    running after a failed command's cleanup must not recreate the tree."""
    fs.check_shared(space.directory, space.name)
    writing = os.path.join(space.directory, f".c{index:09d}-{uuid.uuid4().hex}")
    own = os.path.join(space.directory, f"c{index:09d}")
    with space.errors():
        os.mkdir(writing)
        for part, pairs in partitioned(hashes, ids):
            pairs.tofile(os.path.join(writing, partition_name(part)))
        if rows is not None:
            with pa.OSFile(os.path.join(writing, EXAMPLES_FILE), "wb") as sink, \
                    pa.ipc.new_file(sink, rows.schema) as writer:
                writer.write_batch(rows)
        fs.remove_tree(own)
        os.rename(writing, own)
    return own


def partition_collisions(job: tuple[str, int, int]) -> tuple[list[tuple[int, int]], int]:
    """The reduce task of one partition: its collisions from every chunk's file, the `CONFIRM_PAIRS` from
    number `skip` on, and how many it has in all."""
    directory, part, skip = job
    paths = sorted(glob.glob(os.path.join(glob.escape(directory), "c*", partition_name(part))))
    first, later = repeated(*read_pairs(paths))
    end = skip + CONFIRM_PAIRS
    return list(zip(first[skip:end].tolist(), later[skip:end].tolist())), len(later)


PARTITIONS_PER_TASK = 16
"""Hash partitions one reduce task reads (each is small: 16 bytes an example over 256 partitions)."""


def partitions_collisions(job: tuple[str, int, int]) -> list[tuple[list[tuple[int, int]], int]]:
    """partition_collisions of partitions [first, last), in order, in one task."""
    directory, first, last = job
    return [partition_collisions((directory, part, 0)) for part in range(first, last)]


@dataclass(frozen=True)
class SharedKeys:
    """The pairs prepare_shared wrote in the workspace, their collisions found by one task per partition run by
    `run` (the Runtime's map): in HashIndex's order, since the partitions are HashIndex's."""

    space: Workspace
    run: Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]

    def collisions(self) -> Iterator[tuple[int, int]]:
        jobs = [(self.space.directory, first, first + PARTITIONS_PER_TASK)
                for first in range(0, PARTITIONS, PARTITIONS_PER_TASK)]
        found = (result for results in self.run(partitions_collisions, jobs) for result in results)
        for part, (pairs, total) in enumerate(found):
            yield from pairs
            done = len(pairs)
            while done < total:  # more than a task returns at once: only with that many 64-bit hash collisions
                more, _ = next(iter(self.run(partition_collisions, [(self.space.directory, part, done)])))
                yield from more
                done += len(more)


def check_unique_keys(index: SharedKeys, dataset: Dataset, key: str, threads: int) -> None:
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


__all__ = ["CONFIRM_PAIRS", "SharedKeys", "check_unique_keys", "partition_collisions",
           "prepare_shared", "write_pairs"]
