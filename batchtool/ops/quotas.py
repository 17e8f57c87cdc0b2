"""Class quotas of balanced batches whose running totals track the target, batch after batch."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.ops.regroup import SortedStream
from batchtool.ops.rows import RowReader, cycled_rows


def shares(size: int, target: np.ndarray, behind: np.ndarray) -> np.ndarray:
    """Largest-remainder shares of `size`: floor(size x t_i), plus one for the classes furthest behind their
    running target once this batch's exact share is counted (`behind` + remainder): first those that would
    otherwise fall a whole row behind, then by deficit, ties to the lower class. A class with target 0 never
    gets one (the remainder is smaller than the number of classes with a fractional share)."""
    raw = size * target
    out = np.floor(raw).astype(np.int64)
    deficit = np.where(target > 0, np.round(behind + raw - out, 9), -np.inf)
    order = np.lexsort((np.arange(len(target)), -deficit, deficit < 1))
    out[order[: max(size - int(out.sum()), 0)]] += 1
    return out


@dataclass(frozen=True)
class QuotaLayout:
    """`batches` full batches of `batch_size` rows with rotating quotas, then one smaller batch of exactly
    `partial` rows per class (all zero or empty: none)."""

    target: tuple[float, ...]
    batch_size: int
    batches: int
    partial: tuple[int, ...] = ()

    def full_quotas(self) -> Iterator[np.ndarray]:
        """Every class gets floor(B t_i) or one more per batch, the extra rows going to the classes furthest
        behind, so after j batches class i has j B t_i rows to within one."""
        target = np.asarray(self.target)
        given = np.zeros(len(target))
        for index in itertools.count():
            quotas = shares(self.batch_size, target, index * self.batch_size * target - given)
            given += quotas
            yield quotas

    def sequence(self) -> Iterator[np.ndarray]:
        yield from itertools.islice(self.full_quotas(), self.batches)
        if sum(self.partial):
            yield np.asarray(self.partial, dtype=np.int64)

    @property
    def per_class(self) -> np.ndarray:
        return sum(self.sequence(), np.zeros(len(self.target), dtype=np.int64))


def plan_layout(available: np.ndarray, target: np.ndarray, batch_size: int, *, partial: bool,
                oversample: bool) -> QuotaLayout:
    """Full batches while every class has rows for its quota, then (with `partial`) the largest smaller batch
    whose shares the rows left still cover. With `oversample`: full batches until every targeted class has
    used all its rows at least once (rarer classes repeat); none if a targeted class has no rows."""
    layout = QuotaLayout(tuple(target.tolist()), batch_size, 0)
    used = np.zeros(len(target), dtype=np.int64)
    wanted = target > 0
    if oversample and not np.all(available[wanted] > 0):
        return layout
    batches = 0
    for quotas in layout.full_quotas():
        done = np.all(used[wanted] >= available[wanted]) if oversample else np.any(used + quotas > available)
        if done:
            break
        used += quotas
        batches += 1
    last: tuple[int, ...] = ()
    if partial and not oversample:
        behind = batches * batch_size * target - used
        left = available - used
        # class i gets at least floor(size t_i) <= its rows left, so size < (left_i + 1) / t_i
        largest = min([batch_size - 1, *(int((n + 1) / t) + 1 for n, t in zip(left.tolist(), target.tolist()) if t)])
        for size in range(largest, 0, -1):
            candidate = shares(size, target, behind)
            if np.all(candidate <= left):
                last = tuple(candidate.tolist())
                break
    return QuotaLayout(layout.target, batch_size, batches, last)


def quota_batches(readers: Sequence[RowReader], quotas: Iterable[np.ndarray], seed: int, stage: str,
                  schema: pa.Schema) -> Iterator[Chunk]:
    """Balanced batches: each takes its quota of every class from that class's rows, in their order, and is
    shuffled by the rows' keyed order (`stage`), so no position in a batch favours a class."""
    for row in quotas:
        batch = Chunk.concat([readers[c].take(int(q)) for c, q in enumerate(row) if q], schema)
        yield batch.take(np.argsort(rng.permutation_keys(seed, stage, batch.ids), kind="stable"))


def class_readers(streams: Sequence[SortedStream], begins: Sequence[int], oversample: bool,
                  schema: pa.Schema) -> list[RowReader]:
    """Readers of the classes' sorted streams (an exchange's), from the row of each where a run of balanced
    batches begins (cycling through a class again with `oversample`)."""
    return [RowReader(cycled_rows(s, begin, oversample), schema) for s, begin in zip(streams, begins)]


@dataclass(frozen=True)
class QuotaBatches:
    """Balanced batches cut from the classes' sorted streams (ops.regroup.SortedBatches): batch k takes quotas[k]."""

    streams: list[SortedStream]
    quotas: np.ndarray
    """Rows per class of each batch."""
    seed: int
    stage: str
    schema: pa.Schema

    @property
    def count(self) -> int:
        return len(self.quotas)

    @property
    def rows(self) -> int:
        return int(self.quotas.sum())

    def batch_rows(self, k: int) -> int:
        return int(self.quotas[k].sum())

    def first_row(self, k: int) -> int:
        return int(self.quotas[:k].sum())

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.streams)

    def reader(self, start: int, end: int) -> _QuotaReader:
        begins = tuple(int(n) for n in self.quotas[:start].sum(axis=0))
        return _QuotaReader(self.streams, begins, self.quotas[start:end], self.seed, self.stage, self.schema)


@dataclass(frozen=True)
class _QuotaReader:
    streams: list[SortedStream]
    begins: tuple[int, ...]
    quotas: np.ndarray
    seed: int
    stage: str
    schema: pa.Schema

    def __call__(self) -> Iterator[pa.RecordBatch]:
        readers = class_readers(self.streams, self.begins, False, self.schema)
        for batch in quota_batches(readers, self.quotas, self.seed, self.stage, self.schema):
            yield batch.data


__all__ = ["QuotaBatches", "QuotaLayout", "class_readers", "plan_layout", "quota_batches", "shares"]
