"""Class quotas of balanced batches whose running totals track the target, batch after batch."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.io.example_ids import carry
from batchtool.ops.regroup import SortedBatches, SortedStream, firsts_of
from batchtool.ops.rows import RowReader, cycled_rows


class Curve(Protocol):
    """Each class's cumulative target as a function of the position (rows or tokens handed out): the integral of
    its weight, so a batch's exact share is the curve's increase over the batch."""

    def at(self, position: int) -> np.ndarray: ...

    def over(self, position: int, size: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Constant:
    """Constant weights: position x target (the quota batches of stratify, bucket and mix)."""

    target: np.ndarray

    def at(self, position: int) -> np.ndarray:
        return position * self.target

    def over(self, position: int, size: int) -> np.ndarray:
        return size * self.target


@dataclass(frozen=True)
class Switched:
    """A plan changed at position `switch`: `before` up to it (so every batch before it is the same), then
    `after`'s increase from there on, counted from where `before` left each class (mix --continue)."""

    before: Curve
    after: Curve
    switch: int

    def at(self, position: int) -> np.ndarray:
        if position <= self.switch:
            return self.before.at(position)
        return self.before.at(self.switch) + self.after.at(position) - self.after.at(self.switch)

    def over(self, position: int, size: int) -> np.ndarray:
        if position + size <= self.switch:
            return self.before.over(position, size)
        return self.at(position + size) - self.at(position)


@dataclass(frozen=True)
class Documents:
    """Each class's documents in the order it hands them out, by what each counts (its tokens): cumulative sums,
    so the documents that fit an amount are one search. `cycle`: a class read to its end starts again."""

    cumulative: tuple[np.ndarray, ...]
    """Per class [0, l_1, l_1 + l_2, ...] (int64)."""
    cycle: bool = False
    fills: ClassVar[bool] = False
    """A batch of documents holds about its size: no class is given a document that puts it ahead."""

    def _before(self, i: int, k: int) -> int:
        """What the class's first k documents count."""
        cum = self.cumulative[i]
        n = len(cum) - 1
        if not self.cycle or k <= n or not n:
            return int(cum[min(k, n)])
        return (k // n) * int(cum[-1]) + int(cum[k % n])

    def counted(self, given: np.ndarray, count: np.ndarray) -> np.ndarray:
        """What documents [given_i, given_i + count_i) of each class count."""
        return np.array([self._before(i, int(g + c)) - self._before(i, int(g))
                         for i, (g, c) in enumerate(zip(given.tolist(), count.tolist()))], dtype=np.float64)

    def fit(self, given: np.ndarray, raw: np.ndarray, behind: np.ndarray) -> np.ndarray:
        """The most documents from given_i on that keep each class at or under its running target (`behind` + the
        batch's share `raw`)."""
        out = np.zeros(len(given), dtype=np.int64)
        for i, (g, a) in enumerate(zip(given.tolist(), (behind + raw).tolist())):
            cum = self.cumulative[i]
            n, whole = len(cum) - 1, int(cum[-1])
            if a < 0 or not n:
                continue
            goal = self._before(i, int(g)) + math.floor(round(a, 9))  # whole counts: an int searches without a copy
            if self.cycle and whole:
                laps = goal // whole
                k = laps * n + int(np.searchsorted(cum, goal - laps * whole, side="right")) - 1
            elif self.cycle:  # every document counts 0: a lap of them fits
                k = int(g) + n
            else:
                k = int(np.searchsorted(cum, goal, side="right")) - 1
            out[i] = max(0, k - int(g))
        return out

    def next_length(self, given: np.ndarray) -> np.ndarray:
        """What each class's next document counts (at least 1, so a deficit is in documents; 1 past its end)."""
        return np.maximum(self.counted(given, np.ones(len(given), dtype=np.int64)), 1.0)


@dataclass(frozen=True)
class Units:
    """Rows: every document counts 1 (so fit is the floor, and the quotas are stratify's)."""

    fills: ClassVar[bool] = True
    """A batch of B rows holds exactly B rows."""

    def counted(self, given: np.ndarray, count: np.ndarray) -> np.ndarray:
        return count

    def fit(self, given: np.ndarray, raw: np.ndarray, behind: np.ndarray) -> np.ndarray:
        """The floor of each class's share of the batch; the running deficit goes to the extra rows."""
        return np.floor(raw).astype(np.int64)

    def next_length(self, given: np.ndarray) -> np.ndarray:
        return np.ones(len(given))


ROWS = Units()


def shares(size: int, raw: np.ndarray, behind: np.ndarray, docs: Documents | Units = ROWS,
           given: np.ndarray | None = None) -> np.ndarray:
    """Largest-remainder shares of a batch of `size` (rows, or what the documents count), each class's exact share
    of it `raw`, `behind` its running target before it. Each class first gets the documents that fit (rows: the
    floor of its share; documents: those that fit under its running target, so none falls a document behind),
    then one more for the classes furthest behind once this batch's share is counted (in units of the class's next
    document): first those that would otherwise fall a whole row behind, then by deficit, ties to the lower class,
    while the batch has room (rows: exactly `size`; documents: only to a class still behind, so none gets a document
    ahead). A class with no share and not behind (target 0) never gets one."""
    wanted = (raw > 0) | (behind > 0)
    at = np.zeros(len(raw), dtype=np.int64) if given is None else given
    out = np.where(wanted, docs.fit(at, raw, behind), 0)
    taken = docs.counted(at, out)
    following = docs.next_length(at + out)
    deficit = np.where(wanted, np.round(behind + raw - taken, 9) / following, -np.inf)
    order = np.lexsort((np.arange(len(raw)), -deficit, deficit < 1))
    left = size - taken.sum()
    for i in order.tolist():
        if left <= 0 or not wanted[i] or (deficit[i] <= 0 and not docs.fills):
            break
        out[i] += 1
        left -= following[i]
    return out


@dataclass(frozen=True)
class QuotaLayout:
    """`batches` full batches of `batch_size` (rows, or what `docs` count) with rotating quotas that follow
    `curve` (default: the constant target), then one smaller batch of exactly `partial` rows per class (all zero
    or empty: none)."""

    target: tuple[float, ...]
    batch_size: int
    batches: int
    partial: tuple[int, ...] = ()
    curve: Curve | None = None
    docs: Documents | Units = ROWS

    def _curve(self) -> Curve:
        return self.curve if self.curve is not None else Constant(np.asarray(self.target))

    def full_quotas(self) -> Iterator[np.ndarray]:
        """Every class gets the documents of its exact share (floor(B t_i) rows) or one more per batch, the extra
        ones going to the classes furthest behind, so after j batches class i is within one document of its curve
        at j B (j B t_i rows)."""
        curve = self._curve()
        given = np.zeros(len(self.target))
        docs = np.zeros(len(self.target), dtype=np.int64)
        for index in itertools.count():
            position = index * self.batch_size
            quotas = shares(self.batch_size, curve.over(position, self.batch_size), curve.at(position) - given,
                            self.docs, docs)
            given += self.docs.counted(docs, quotas)
            docs += quotas
            yield quotas

    def last(self, used: np.ndarray, given: np.ndarray, size: int) -> np.ndarray:
        """The quotas of a batch of `size` after the full batches (`used` documents counting `given`)."""
        curve = self._curve()
        position = self.batches * self.batch_size
        return shares(size, curve.over(position, size), curve.at(position) - given, self.docs, used)

    def below_overrun(self, used: np.ndarray, given: np.ndarray, left: np.ndarray, largest: int) -> int:
        """A size up to `largest` above which no last batch of documents (not cycled) fits the documents `left`:
        below the smallest size whose running target passes all a class's documents left by 2 (plus the classes'
        lag behind their targets). There that class gets them all and is still a document behind, so the extra
        documents `shares` gives start with one it does not have. Found by a binary search (the targets only grow
        with the size), so the last batch is searched from here down: a few sizes, not one per unit of the batch."""
        curve = self._curve()
        position = self.batches * self.batch_size
        behind = curve.at(position) - given
        counts_left = self.docs.counted(used, left)
        margin = 2 + np.maximum(behind, 0).sum()

        def overruns(size: int) -> bool:
            return bool(np.max(behind + curve.over(position, size) - counts_left) >= margin)

        lo, hi = 1, largest + 1  # the smallest size in [1, largest] that overruns, or largest + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if overruns(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo - 1

    def sequence(self) -> Iterator[np.ndarray]:
        yield from itertools.islice(self.full_quotas(), self.batches)
        if sum(self.partial):
            yield np.asarray(self.partial, dtype=np.int64)

    @property
    def per_class(self) -> np.ndarray:
        return sum(self.sequence(), np.zeros(len(self.target), dtype=np.int64))


def plan_layout(available: np.ndarray, target: np.ndarray, batch_size: int, *, partial: bool,
                oversample: bool, curve: Curve | None = None, docs: Documents | Units = ROWS,
                end: int | None = None) -> QuotaLayout:
    """Full batches while every class has documents for its quota (and, given an `end`, while they fit before
    it), then (with `partial`) the largest smaller batch whose shares the documents left still cover (up to `end`).
    With `oversample`: full batches until every targeted class has used all its rows at least once (rarer
    classes repeat); none if a targeted class has no rows. `curve` and `docs`: quotas that follow a schedule of
    weights, by what each document counts (QuotaLayout)."""
    layout = QuotaLayout(tuple(target.tolist()), batch_size, 0, (), curve, docs)
    used = np.zeros(len(target), dtype=np.int64)
    wanted = target > 0
    if oversample and not np.all(available[wanted] > 0):
        return layout
    batches = 0
    for quotas in layout.full_quotas():
        done = np.all(used[wanted] >= available[wanted]) if oversample else np.any(used + quotas > available)
        if done or (end is not None and (batches + 1) * batch_size > end):
            break
        used += quotas
        batches += 1
    layout = replace(layout, batches=batches)
    last: tuple[int, ...] = ()
    if partial and not oversample:
        given = docs.counted(np.zeros(len(target), dtype=np.int64), used)
        left = available - used
        largest = batch_size - 1
        if docs is ROWS:  # class i gets at least floor(size t_i) <= its rows left, so size < (left_i + 1) / t_i
            largest = min([largest, *(int((n + 1) / t) + 1 for n, t in zip(left.tolist(), target.tolist()) if t)])
        elif isinstance(docs, Documents) and not docs.cycle:
            largest = layout.below_overrun(used, given, left, largest)
        if end is not None:
            largest = min(largest, end - batches * batch_size)
        for size in range(largest, 0, -1):
            candidate = layout.last(used, given, size)
            if np.all(candidate <= left):
                last = tuple(candidate.tolist())
                break
    return replace(layout, partial=last)


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
class QuotaBatches(SortedBatches):
    """Balanced batches cut from the classes' sorted streams (ops.regroup.SortedBatches): batch k takes quotas[k],
    each carrying its rows' example ids (batchtool.io.example_ids)."""

    streams: list[SortedStream]
    quotas: np.ndarray
    """Rows per class of each batch."""
    seed: int
    stage: str
    schema: pa.Schema
    cycle: bool = False
    """A class read to its end starts again (mix --replacement: every row k or k+1 times)."""

    @functools.cached_property
    def firsts(self) -> np.ndarray:  # type: ignore[override]
        return firsts_of(self.quotas.sum(axis=1))

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.streams)

    def reader(self, start: int, end: int) -> _QuotaReader:
        begins = tuple(int(n) for n in self.quotas[:start].sum(axis=0))
        return _QuotaReader(self.streams, begins, self.quotas[start:end], self.seed, self.stage, self.schema,
                            self.cycle)


@dataclass(frozen=True)
class _QuotaReader:
    streams: list[SortedStream]
    begins: tuple[int, ...]
    quotas: np.ndarray
    seed: int
    stage: str
    schema: pa.Schema
    cycle: bool = False

    def __call__(self) -> Iterator[pa.RecordBatch]:
        readers = class_readers(self.streams, self.begins, self.cycle, self.schema)
        for batch in quota_batches(readers, self.quotas, self.seed, self.stage, self.schema):
            yield carry(batch.data, batch.ids)


__all__ = ["ROWS", "Constant", "Curve", "Documents", "QuotaBatches", "QuotaLayout", "Switched", "Units", "class_readers",
           "plan_layout", "quota_batches", "shares"]
