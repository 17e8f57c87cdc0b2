"""bucket as map-reduce on a remote engine's workers (Operation.exchange): map tasks keep, measure and bucket their
rows and scatter them to per-bucket key ranges, reduce tasks sort each range, a task per bucket cuts the bucket's
batches from its sorted lengths, and the driver only interleaves the buckets' batch counts; the rows are read,
padded and written where the shards are written. The same batches, order and statistics as Bucket.regroup, which
reads the same rows back from its local spill."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.dataset import Chunk
from batchtool.ops.labels import Locate
from batchtool.ops.base import Cut, Exchange, Probe, Runtime, Scatter, Scattered, SortedStream
from batchtool.ops.bucket_batches import (BALANCE_STAGE, INTERLEAVE_STAGE, ORDER_STAGE, assign, make_batch, rebalance,
                                          spill_groups, spill_schema)
from batchtool.ops.bucket_plan import BucketColumns, BucketPlan, flush_bytes, row_bytes, with_spill_layout
from batchtool.ops.bucket_report import BucketCounts, bucket_stats
from batchtool.ops.quotas import class_readers, quota_batches
from batchtool.ops.rows import sorted_rows, take_sizes
from batchtool.spill import interleave


def exchange(plan: BucketPlan, data: Any, probe: Probe) -> Exchange:
    """bucket's Exchange: its spill's groups, parts and keys (parts sized from the first chunk, measured on a
    worker), `assign` on the map workers, and the cut below."""
    measured = probe(functools.partial(_row_bytes, plan.columns))
    plan = with_spill_layout(plan, measured if measured is not None else row_bytes(None, plan.columns))
    by_length = plan.balance is None and plan.order != "shuffle"  # --order sorted: each part by length
    scatter = Scatter(spill_schema(data.schema, plan.columns), tuple(plan.parts), plan.seed, ORDER_STAGE,
                      flush_bytes(plan, plan.options.memory), functools.partial(_assigned, plan, data.locate),
                      keyed=not by_length,
                      order=functools.partial(_by_length, plan.columns.names["length"]) if by_length else None)
    return Exchange(scatter, functools.partial(_cut, plan))


def _by_length(column: str, rows: pa.RecordBatch) -> np.ndarray:
    """--order sorted: a part's rows by ascending length, ties in input order."""
    return np.argsort(rows.column(column).to_numpy(), kind="stable")


def _row_bytes(columns: BucketColumns, chunk: Chunk) -> tuple[float, float]:
    return row_bytes(chunk.data, columns)


def _assigned(plan: BucketPlan, locate: Locate, chunk: Chunk) -> tuple[Chunk, np.ndarray, tuple[int, int, int]]:
    """The map side of a chunk: its kept rows with their lengths, their spill groups, and what it dropped."""
    a = assign(chunk, plan, locate)
    lengths = a.chunk.data.column(plan.columns.names["length"]).to_numpy()
    return a.chunk, spill_groups(a.buckets, lengths, plan, a.classes), (a.rows_in, a.dropped_keep, a.dropped_oversize)


# -- each bucket's batches, cut on a worker from its lengths ------------------------------------------------------


def _lengths(chunks: Iterator[Chunk], column: str) -> np.ndarray:
    return np.concatenate([np.zeros(0, np.int32), *(c.data.column(column).to_numpy() for c in chunks)])


@dataclass(frozen=True)
class BucketCut:
    """One bucket's batches in its own order: rows and padded length of each, its real elements, what
    --drop-remainder dropped; with --balance each batch's rows per class."""

    sizes: np.ndarray
    real: np.ndarray
    pad: np.ndarray
    dropped: int = 0
    quotas: np.ndarray | None = None


def _summed(plan: BucketPlan, bucket: int, sizes: np.ndarray, lengths: np.ndarray, dropped: int = 0,
            quotas: np.ndarray | None = None) -> BucketCut:
    """Real elements and padded length of each batch (as plan.padded_length pads it), from its rows' lengths
    (`lengths` laid end to end; every batch has a row)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    edges = np.cumsum(sizes) - sizes
    lengths = lengths[:int(sizes.sum())].astype(np.int64)
    real = np.add.reduceat(lengths, edges) if len(sizes) else np.zeros(0, np.int64)
    fixed = plan.pad_to[bucket]
    if fixed is not None:
        pad = np.full(len(sizes), fixed, dtype=np.int64)
    else:
        pad = np.maximum.reduceat(lengths, edges) if len(sizes) else np.zeros(0, np.int64)
    return BucketCut(sizes, real, pad, dropped, quotas)


def _bucket_cut(plan: BucketPlan, item: tuple[int, list[SortedStream]]) -> BucketCut:
    """A bucket's batch sizes from its lengths in output order, as batch_sizes cuts them from the local spill."""
    bucket, streams = item
    lengths = _lengths(sorted_rows(streams, 0), plan.columns.names["length"])
    budget = plan.budgets[bucket]
    sizes = budget.cut([lengths], plan.pad_to[bucket])
    dropped = 0
    if plan.options.drop_remainder and len(sizes) and budget.is_partial(int(sizes[-1])):
        dropped, sizes = int(sizes[-1]), sizes[:-1]
    return _summed(plan, bucket, sizes, lengths, dropped)


def _balanced_cut(plan: BucketPlan, item: tuple[int, list[SortedStream]]) -> BucketCut:
    """A bucket's balanced batches (their quotas from its layout), with the lengths they take from each class."""
    bucket, streams = item
    assert plan.balance is not None
    quotas = np.array(list(plan.balance.layouts[bucket].sequence()), dtype=np.int64).reshape(-1, len(streams))
    name = plan.columns.names["length"]
    per_class = [_lengths(s.chunks(), name) for s in streams]
    starts = np.cumsum(quotas, axis=0) - quotas  # rows each batch skips in each class (cycling: modulo its rows)
    lengths = np.concatenate([np.zeros(0, np.int32), *(per_class[c][np.arange(s, s + q) % max(1, len(per_class[c]))]
                                                       for row, first in zip(quotas, starts)
                                                       for c, (q, s) in enumerate(zip(row, first)) if q)])
    return _summed(plan, bucket, quotas.sum(axis=1), lengths, quotas=quotas)


# -- the driver's part: counts, the order of batches ------------------------------------------------------------


def _cut(plan: BucketPlan, scattered: Scattered, runtime: Runtime) -> Cut:
    """Every bucket's batches cut on the workers, interleaved here from their counts alone; the statistics as
    Bucket.regroup counts them."""
    n = plan.num_buckets
    counts = BucketCounts.zeros(n)
    for rows_in, keep, oversize in scattered.stats:
        counts.rows_in += rows_in
        counts.dropped["keep"] += keep
        counts.dropped["oversize"] += oversize
    if plan.balance is None:
        gpb = plan.groups_per_bucket if plan.order != "shuffle" else 1
        streams = [scattered.groups[b * gpb:(b + 1) * gpb] for b in range(n)]
        cuts = list(runtime.map(functools.partial(_bucket_cut, plan), enumerate(streams)))
    else:
        k = plan.balance.num_classes
        plan = replace(plan, balance=rebalance(plan, scattered.rows, counts))
        streams = [scattered.groups[b * k:(b + 1) * k] for b in range(n)]
        cuts = list(runtime.map(functools.partial(_balanced_cut, plan), enumerate(streams)))
    for b, cut in enumerate(cuts):
        counts.examples[b] += int(cut.sizes.sum())
        counts.batches[b] += len(cut.sizes)
        counts.real[b] += int(cut.real.sum())
        counts.padded[b] += int((cut.sizes * cut.pad).sum())
        counts.dropped["remainder"] += cut.dropped
    if plan.balance is not None:
        _count_shares(plan, cuts, counts)
    batches = BucketBatches.make(plan, scattered.schema, streams, cuts)
    return Cut(batches, functools.partial(bucket_stats, plan, counts))


def _count_shares(plan: BucketPlan, cuts: Sequence[BucketCut], counts: BucketCounts) -> None:
    """--balance: the smallest and largest share of each class over the full batches, from their quotas (a
    balanced batch's rows of class c are the quota it took from class c)."""
    assert plan.balance is not None
    shares = [quotas / int(size) for b, cut in enumerate(cuts) for quotas, size in zip(cut.quotas, cut.sizes)
              if size == plan.balance.layouts[b].batch_size]
    if shares:
        counts.shares = [np.minimum.reduce(shares), np.maximum.reduce(shares)]


def _output_order(plan: BucketPlan, per_bucket: Sequence[int]) -> np.ndarray:
    """The bucket of every output batch: the seeded interleaving `batches` merges the buckets' streams in (it
    depends only on the counts), or one bucket after another."""
    total = int(sum(per_bucket))
    if plan.order == "shuffle":
        picks = interleave([itertools.repeat(None)] * len(per_bucket), per_bucket, plan.seed, INTERLEAVE_STAGE)
        return np.fromiter((b for b, _ in picks), dtype=np.int64, count=total)
    return np.repeat(np.arange(len(per_bucket), dtype=np.int64), per_bucket)


@dataclass(frozen=True)
class BucketBatches:
    """bucket's output batches (ops.base.Batches): batch k is batch `index[k]` of bucket `bucket[k]`."""

    plan: BucketPlan
    schema: pa.Schema
    streams: list[list[SortedStream]]
    cuts: list[BucketCut]
    bucket: np.ndarray
    index: np.ndarray
    firsts: np.ndarray
    """Each batch's first output row (and the total rows last)."""

    @classmethod
    def make(cls, plan: BucketPlan, schema: pa.Schema, streams: list[list[SortedStream]],
             cuts: list[BucketCut]) -> BucketBatches:
        bucket = _output_order(plan, [len(c.sizes) for c in cuts])
        index = np.zeros(len(bucket), dtype=np.int64)
        for b in range(len(cuts)):
            at = np.flatnonzero(bucket == b)
            index[at] = np.arange(len(at))
        per_bucket = np.array([len(c.sizes) for c in cuts], dtype=np.int64)
        sizes = np.concatenate([np.zeros(0, np.int64), *(c.sizes for c in cuts)])[
            (np.cumsum(per_bucket) - per_bucket)[bucket] + index]
        return cls(plan, schema, streams, cuts, bucket, index, np.concatenate([[0], np.cumsum(sizes)]))

    @property
    def count(self) -> int:
        return len(self.bucket)

    @property
    def rows(self) -> int:
        return int(self.firsts[-1])

    def batch_rows(self, k: int) -> int:
        return int(self.firsts[k + 1] - self.firsts[k])

    def first_row(self, k: int) -> int:
        return int(self.firsts[k])

    def nbytes(self) -> int:
        return sum(s.nbytes() for streams in self.streams for s in streams)

    def reader(self, start: int, end: int) -> BucketReader:
        """Batches [start, end): only their buckets' streams, and where in each their rows begin."""
        plan = self.plan
        batches = [(k, int(self.bucket[k]), int(self.index[k])) for k in range(start, end)]
        used = sorted({b for _, b, _ in batches})
        first = {b: min(j for _, c, j in batches if c == b) for b in used}
        cut = self.cuts
        if plan.balance is None:
            begins = {b: (int(cut[b].sizes[:first[b]].sum()),) for b in used}
        else:
            begins = {b: tuple(int(x) for x in cut[b].quotas[:first[b]].sum(axis=0)) for b in used}
        spec = [(k, b, int(cut[b].sizes[j]), int(cut[b].pad[j]),
                 None if cut[b].quotas is None else tuple(int(q) for q in cut[b].quotas[j])) for k, b, j in batches]
        balance = plan.balance
        return BucketReader(self.schema, plan.columns, dict(plan.pad_values), plan.options.mask, plan.seed,
                            None if balance is None else balance.oversample, {b: self.streams[b] for b in used},
                            begins, spec)


@dataclass(frozen=True)
class BucketReader:
    """A run of bucket's output batches, read and padded on a worker from the sorted streams (Batches.reader)."""

    schema: pa.Schema
    columns: BucketColumns
    pad_values: dict[str, Any]
    mask: bool
    seed: int
    oversample: bool | None
    """--balance: whether classes cycle (None: not balanced)."""
    streams: dict[int, list[SortedStream]]
    begins: dict[int, tuple[int, ...]]
    """Per bucket, the row of its stream (with --balance, of each class's) where the run's rows begin."""
    batches: list[tuple[int, int, int, int, tuple[int, ...] | None]]
    """(output index, bucket, rows, padded length, quotas per class) of each batch."""

    def __call__(self) -> Iterator[pa.RecordBatch]:
        if self.oversample is None:
            rows = self._cut()
        else:
            rows = self._balanced()
        for (k, b, _, pad, _), data in zip(self.batches, rows):
            yield make_batch(data.data, k, b, pad, self.columns, self.pad_values, self.mask)

    def _cut(self) -> Iterator[Chunk]:
        """Each batch's rows, cut from its bucket's stream as take_sizes cuts them locally."""
        sizes = {b: [n for _, c, n, _, _ in self.batches if c == b] for b in self.streams}
        cuts = {b: take_sizes(sorted_rows(self.streams[b], self.begins[b][0]), sizes[b], self.schema)
                for b in self.streams}
        for _, b, _, _, _ in self.batches:
            yield next(cuts[b])

    def _balanced(self) -> Iterator[Chunk]:
        """Each batch's quotas taken from its classes' streams and shuffled, as balanced_stream makes them."""
        batches = {b: quota_batches(class_readers(self.streams[b], self.begins[b], bool(self.oversample), self.schema),
                                    [q for _, c, _, _, q in self.batches if c == b], self.seed, BALANCE_STAGE,
                                    self.schema) for b in self.streams}
        for _, b, _, _, _ in self.batches:
            yield next(batches[b])


__all__ = ["BucketBatches", "BucketCut", "BucketReader", "exchange"]
