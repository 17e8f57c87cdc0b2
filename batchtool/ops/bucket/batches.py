"""bucket's second pass and batches: the per-chunk kernel (keep, measure, assign a bucket), the scatter to
per-bucket spills, each bucket's rows in output order cut into batches, and one padded output batch."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.io import load_padding
from batchtool.io.dataset import Chunk
from batchtool.io.example_ids import carry
from batchtool.core.errors import OptionInputError, OptionSchemaError, SchemaError
from batchtool.ops import names as own
from batchtool.ops.regroup import (Cut, Exchange, Input, Probe, Runtime, Scatter, Scattered, SortedBatches,
                                   SortedStream, firsts_of)
from batchtool.ops.boundaries import assign_buckets
from batchtool.ops.bucket.grid import Grid
from batchtool.ops.bucket.plan import Balance, BucketColumns, BucketPlan, make_balance, with_spill_layout
from batchtool.ops.keyed import flush_bytes, spill_row_bytes
from batchtool.ops.batching import BatchBudget
from batchtool.ops.bucket.report import BucketCounts, bucket_stats
from batchtool.ops.rows import keep_mask
from batchtool.ops.labels import Locate, label_codes
from batchtool.ops.quotas import class_readers, quota_batches
from batchtool.ops.rows import sorted_rows, take_sizes
from batchtool.io.padding import pad_batch, padded_batch, row_lengths, sequence_lengths
from batchtool.io.spill import interleave
from batchtool.io.stats import lengths_of

ORDER_STAGE, INTERLEAVE_STAGE, BALANCE_STAGE = "bucket/order", "bucket/interleave", "bucket/balance"


# -- the kernel: one input chunk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assigned:
    """One input chunk after filtering: rows with a `length` column, their buckets and what was dropped."""

    chunk: Chunk
    buckets: np.ndarray
    rows_in: int
    dropped_keep: int
    dropped_oversize: int
    classes: np.ndarray | None = None


def assign(chunk: Chunk, plan: BucketPlan, locate: Callable[[int], str]) -> Assigned:
    """Filter by --keep, measure, bucket and check a chunk; a pure function run on worker threads."""
    cols = plan.columns
    rows_in = chunk.num_rows
    if cols.keep is not None:
        chunk = chunk.filter(keep_mask(chunk, cols.keep))
    kept = chunk.num_rows
    if plan.grid is not None:
        lengths, second = measure_grid(chunk, plan, locate)
        buckets = plan.grid.cell_of(lengths, second)
        oversize = ~plan.grid.fits_alone(buckets, lengths, second)
    else:
        lengths = true_lengths(chunk, plan, locate)
        second = None
        if plan.boundaries is not None:
            buckets = assign_buckets(lengths, plan.boundaries)
        else:
            buckets = _bucket_column(chunk, cols.bucket, plan.num_buckets, locate)
        oversize = _oversize(lengths, buckets, plan)
    if oversize.any():
        if not plan.options.drop_oversize:
            i = int(np.flatnonzero(oversize)[0])
            if plan.grid is not None:
                raise _oversize_grid(plan.grid, lengths[i], second[i], int(buckets[i]), f"{locate(chunk.ids[i])}: ")
            padded = plan.padded_length(int(buckets[i]), lengths[i:i + 1])
            limit = plan.budgets[0]
            cost = f" ({{cost}} {limit.cost}: {limit.row_cost(padded):,})" if limit.cost != "linear" else ""
            raise OptionInputError("max_tokens", f"an example of length {lengths[i]} padded to {padded} steps exceeds "
                                   f"{{max_tokens}} {limit.max_tokens}{cost} on its own (pass {{drop_oversize}} to "
                                   "drop such examples)", mentions=("cost", "drop_oversize"),
                                   where=f"{locate(chunk.ids[i])}: ")
        keep = ~oversize
        chunk, lengths, buckets = chunk.filter(keep), lengths[keep], buckets[keep]
        second = second[keep] if second is not None else None
    classes = None
    if plan.balance is not None:
        classes = label_codes(chunk, cols.label, plan.balance.num_classes, locate)
    data = chunk.data.drop_columns(list(cols.replaced)) if cols.replaced else chunk.data
    names = cols.names
    for role, computed in (("length", lengths), ("bucket", buckets)):
        if role in cols.reused:
            own.check_adopted(chunk, names[role], computed, locate, "bucket", role, f"its {role} is {{}}")
    data = data.append_column(names["length"], pa.array(lengths.astype(np.int32)))
    if second is not None:
        data = data.append_column(names["length_2"], pa.array(second.astype(np.int32)))
    return Assigned(Chunk(data, chunk.ids), buckets, rows_in, rows_in - kept, int(oversize.sum()), classes)


def true_lengths(chunk: Chunk, plan: BucketPlan, locate: Callable[[int], str]) -> np.ndarray:
    """True length per row: the sequence columns' shared length, which --length must agree with."""
    cols = plan.columns

    def at(i: int) -> str:
        return locate(chunk.ids[i])

    seq = None
    if cols.sequences:
        try:
            seq = sequence_lengths(chunk.data, cols.sequences, at)
        except SchemaError as exc:
            if plan.options.sequence:
                raise
            raise OptionSchemaError("sequence", f"{exc}; pass {{sequence}} to choose the columns to pad") from exc
    lengths = lengths_of(chunk.data, cols.length) if cols.length not in cols.sequences else seq
    if seq is not None and cols.length not in cols.sequences:
        bad = np.flatnonzero(lengths != seq)
        if len(bad):
            i = int(bad[0])
            raise SchemaError(f"{at(i)}: column {cols.length!r} says length {lengths[i]} but sequence column "
                              f"{cols.sequences[0]!r} has {seq[i]} steps")
    if len(lengths) and lengths.min() < 0:
        i = int(np.argmin(lengths))
        raise SchemaError(f"{at(i)}, column {cols.length!r}: a negative length ({lengths[i]})")
    return lengths


def measure_grid(chunk: Chunk, plan: BucketPlan, locate: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """Two --length: each row's steps of the two sequences, which each --length column must agree with."""
    cols = plan.columns
    out = []
    for length, sequence in zip((cols.length, cols.second), cols.sequences):
        steps = row_lengths(chunk.data.column(sequence))
        if length != sequence:
            given = lengths_of(chunk.data, length)
            bad = np.flatnonzero(given != steps)
            if len(bad):
                i = int(bad[0])
                raise SchemaError(f"{locate(chunk.ids[i])}: column {length!r} says length {given[i]} but sequence "
                                  f"column {sequence!r} has {steps[i]} steps")
        out.append(steps)
    return out[0], out[1]


def _oversize_grid(grid: Grid, first: int, second: int, cell: int, where: str) -> OptionInputError:
    """The error for a row over --max-tokens on its own (two --length), as one length words it."""
    limit = grid.budget
    pad = grid.pad_to(cell) or (first, second)
    return OptionInputError("max_tokens", f"an example of lengths {first} x {second} padded to {pad[0]} x {pad[1]} "
                            f"steps costs {float(limit.row_cost(*pad)):g}, more than {{max_tokens}} "
                            f"{limit.max_tokens} on its own (pass {{drop_oversize}} to drop such examples)",
                            mentions=("cost", "drop_oversize"), where=where)


def _bucket_column(chunk: Chunk, column: str, num_buckets: int, locate: Callable[[int], str]) -> np.ndarray:
    arr = chunk.data.column(column)
    values = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero((values < 0) | (values >= num_buckets))
    if len(bad):
        i = int(bad[0])
        shown = "null" if arr[i].as_py() is None else values[i]
        raise OptionInputError("num_buckets", f"bucket {shown} is outside [0, {num_buckets}) ({{num_buckets}} "
                               f"{num_buckets})", where=f"{locate(chunk.ids[i])}, column {column!r}: ")
    return values.astype(np.int32)


def _oversize(lengths: np.ndarray, buckets: np.ndarray, plan: BucketPlan) -> np.ndarray:
    """Rows that exceed --max-tokens even alone in a batch (padded to their bucket's boundary, if fixed)."""
    fixed = np.array([-1 if p is None else p for p in plan.pad_to], dtype=np.int64)[buckets]
    return ~plan.budgets[0].fits_alone(np.where(fixed >= 0, fixed, lengths))


# -- the scatter: every kept row to its bucket's spill ---------------------------------------------------------


def spill_schema(schema: pa.Schema, columns: BucketColumns) -> pa.Schema:
    """What is spilled per row: the input columns (less those an output column replaces) and the length."""
    second = [pa.field(columns.names["length_2"], pa.int32())] if columns.second is not None else []
    return pa.schema([*(f for f in schema if f.name not in columns.replaced),
                      pa.field(columns.names["length"], pa.int32()), *second])


def spill_groups(buckets: np.ndarray, lengths: np.ndarray, plan: BucketPlan,
                 classes: np.ndarray | None = None) -> np.ndarray:
    """Spill group per row: its bucket, with --balance its (bucket, class), or with --order sorted its
    (bucket, length range)."""
    if plan.balance is not None:
        return buckets.astype(np.int64) * plan.balance.num_classes + classes
    if plan.order == "shuffle":
        return buckets
    return buckets.astype(np.int64) * plan.groups_per_bucket + assign_buckets(lengths, plan.length_ranges)


# -- batches: each bucket's rows in output order, cut into batches ---------------------------------------------


def rebalance(plan: BucketPlan, spilled: np.ndarray, counts: BucketCounts) -> Balance:
    """The layouts again from the exact rows spilled per (bucket, class) group (the first pass's counts do not
    know which rows --drop-oversize drops); what no batch takes is counted as dropped."""
    assert plan.balance is not None
    k = plan.balance.num_classes
    available = spilled.reshape(plan.num_buckets, k)
    rows = [BatchBudget(batch_size=layout.batch_size) for layout in plan.balance.layouts]
    balance = make_balance(plan.options, available, rows, np.zeros(len(rows), dtype=np.int64))
    counts.dropped["unbalanced"] = int(np.maximum(available - balance.written, 0).sum())
    counts.balance = balance
    return balance


# -- one output batch ------------------------------------------------------------------------------------------


def make_batch(data: pa.RecordBatch, index: int, bucket: int, pad_length: int | None, columns: BucketColumns,
               pad_values: Mapping[str, Any], mask: bool, pad_2: int | None = None) -> pa.RecordBatch:
    """One output batch: sequence columns padded to `pad_length` (None: at their real lengths, for load to pad),
    plus batch, bucket, length (and mask, only beside padded columns); with two --length, the second sequence
    padded to `pad_2` and its steps in length_2 last."""
    n = data.num_rows
    out = columns.names
    own = [(out["batch"], pa.array(np.full(n, index, dtype=np.int64))),
           (out["bucket"], pa.array(np.full(n, bucket, dtype=np.int32)))]
    sequences, second = columns.sequences, None
    if columns.second is not None:
        sequences, second = sequences[:1], data.column(out["length_2"])
        data = pad_batch(data.drop_columns([out["length_2"]]), columns.sequences[1:], pad_2, pad_values)
    made = padded_batch(data, sequences, pad_length, pad_values, own,
                        (out["length"], data.column(out["length"])), out["mask"] if mask else None)
    return made if second is None else made.append_column(out["length_2"], second)


def output_schema(schema: pa.Schema, columns: BucketColumns, mask: bool, padded: bool) -> pa.Schema:
    """The schema bucket writes for an input of this schema: an empty batch's."""
    spilled = spill_schema(schema, columns)
    made = make_batch(pa.RecordBatch.from_pylist([], schema=spilled), 0, 0, 0 if padded else None, columns, {}, mask,
                      0 if padded else None)
    return pa.schema(made.schema, metadata=schema.metadata)


def exchange(plan: BucketPlan, input: Input, probe: Probe) -> Exchange:
    """bucket's Exchange: its spill's groups, parts and keys (parts sized from the first chunk, measured on a
    worker), `assign` on the map workers, and the cut below."""
    measured = probe(functools.partial(_row_bytes, plan.columns))
    plan = with_spill_layout(plan, measured if measured is not None else spill_row_bytes(None, plan.columns))
    by_length = plan.balance is None and plan.order != "shuffle"  # --order sorted: each part by length
    scatter = Scatter(spill_schema(input.schema, plan.columns), tuple(plan.parts), plan.seed, ORDER_STAGE,
                      flush_bytes(plan.memory, sum(plan.parts), plan.tasks),
                      functools.partial(_assigned, plan, input.locate),
                      keyed=not by_length,
                      order=functools.partial(_by_length, plan.columns.names["length"]) if by_length else None)
    return Exchange(scatter, functools.partial(_cut, plan))


def _by_length(column: str, rows: pa.RecordBatch) -> np.ndarray:
    """--order sorted: a part's rows by ascending length, ties in input order."""
    return np.argsort(rows.column(column).to_numpy(), kind="stable")


def _row_bytes(columns: BucketColumns, chunk: Chunk) -> tuple[float, float]:
    return spill_row_bytes(chunk.data, columns)


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
    pad_2: np.ndarray | None = None
    """Two --length: each batch's padded second length (`pad` is the first's; `real` counts both)."""
    cost: np.ndarray | None = None
    """Two --length: each batch's cost, rows x the cost of a row padded to (pad, pad_2)."""

    @property
    def padded(self) -> int:
        """Padded elements of all the cell's batches (both lengths)."""
        return int((self.sizes * (self.pad + (self.pad_2 if self.pad_2 is not None else 0))).sum())


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


def _cell_cut(plan: BucketPlan, grid: Grid, item: tuple[int, list[SortedStream]]) -> BucketCut:
    """Two --length: a cell's batches cut by the grid's budget from both lengths in output order, each padded to
    its longest row in each dimension (or the cell's longest, --pad-to-boundary), with their costs."""
    cell, streams = item
    names = plan.columns.names
    chunks = list(sorted_rows(streams, 0))
    first, second = _lengths(iter(chunks), names["length"]), _lengths(iter(chunks), names["length_2"])
    sizes = grid.budget.cut(first, second, grid.pad_to(cell))
    dropped = 0
    if plan.options.drop_remainder and len(sizes) and grid.budget.is_partial(int(sizes[-1])):
        dropped, sizes = int(sizes[-1]), sizes[:-1]
    return _cell_summed(plan, grid, cell, sizes, first, second, dropped)


def _cell_summed(plan: BucketPlan, grid: Grid, cell: int, sizes: np.ndarray, first: np.ndarray, second: np.ndarray,
                 dropped: int = 0, quotas: np.ndarray | None = None) -> BucketCut:
    """Two --length: `_summed` over both lengths (laid end to end in batch order), each batch padded to its
    longest row in each dimension (or the cell's longest), with its cost."""
    one, two = _summed(plan, cell, sizes, first), _summed(plan, cell, sizes, second)
    fixed = grid.pad_to(cell)
    pad_1, pad_2 = (one.pad, two.pad) if fixed is None else (np.full(len(sizes), fixed[0], np.int64),
                                                             np.full(len(sizes), fixed[1], np.int64))
    return BucketCut(one.sizes, one.real + two.real, pad_1, dropped, quotas, pad_2=pad_2,
                     cost=grid.budget.batch_cost(one.sizes, pad_1, pad_2))


def _bucket_cut(plan: BucketPlan, item: tuple[int, list[SortedStream]]) -> BucketCut:
    """A bucket's batch sizes from its lengths in output order, as batch_sizes cuts them from the local spill."""
    bucket, streams = item
    if plan.grid is not None:
        return _cell_cut(plan, plan.grid, item)
    lengths = _lengths(sorted_rows(streams, 0), plan.columns.names["length"])
    budget = plan.budgets[bucket]
    sizes = budget.cut([lengths], plan.pad_to[bucket])
    dropped = 0
    if plan.options.drop_remainder and len(sizes) and budget.is_partial(int(sizes[-1])):
        dropped, sizes = int(sizes[-1]), sizes[:-1]
    return _summed(plan, bucket, sizes, lengths, dropped)


def _balanced_cut(plan: BucketPlan, item: tuple[int, list[SortedStream]]) -> BucketCut:
    """A bucket's (or cell's) balanced batches (their quotas from its layout), with the lengths they take from each
    class."""
    bucket, streams = item
    assert plan.balance is not None
    quotas = np.array(list(plan.balance.layouts[bucket].sequence()), dtype=np.int64).reshape(-1, len(streams))
    starts = np.cumsum(quotas, axis=0) - quotas  # rows each batch skips in each class (cycling: modulo its rows)

    def taken(name: str) -> np.ndarray:
        """The lengths of this column each batch takes from each class, batch after batch."""
        per_class = [_lengths(s.chunks(), name) for s in streams]
        return np.concatenate([np.zeros(0, np.int32), *(per_class[c][np.arange(s, s + q) % max(1, len(per_class[c]))]
                                                        for row, first in zip(quotas, starts)
                                                        for c, (q, s) in enumerate(zip(row, first)) if q)])

    names = plan.columns.names
    if plan.grid is not None:
        return _cell_summed(plan, plan.grid, bucket, quotas.sum(axis=1), taken(names["length"]),
                            taken(names["length_2"]), quotas=quotas)
    return _summed(plan, bucket, quotas.sum(axis=1), taken(names["length"]), quotas=quotas)


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
        cuts = list(runtime.executor.map(functools.partial(_bucket_cut, plan), enumerate(streams)))
    else:
        k = plan.balance.num_classes
        plan = replace(plan, balance=rebalance(plan, scattered.rows, counts))
        streams = [scattered.groups[b * k:(b + 1) * k] for b in range(n)]
        cuts = list(runtime.executor.map(functools.partial(_balanced_cut, plan), enumerate(streams)))
    for b, cut in enumerate(cuts):
        counts.examples[b] += int(cut.sizes.sum())
        counts.batches[b] += len(cut.sizes)
        counts.real[b] += int(cut.real.sum())
        counts.padded[b] += cut.padded
        counts.dropped["remainder"] += cut.dropped
        if cut.cost is not None and len(cut.cost):
            counts.cost[b] = float(cut.cost.max())
    if plan.balance is not None:
        _count_shares(plan, cuts, counts)
    batches = BucketBatches.make(plan, scattered.schema, streams, cuts)
    return Cut(batches, functools.partial(bucket_stats, plan, counts), padding=_load_padding(plan))


def _load_padding(plan: BucketPlan) -> dict[str, Any] | None:
    """--padding on-load: what batchtool.load needs to pad the batches as they would have been stored (with two
    --length, each sequence to its own length: the batch's longest in its dimension, or its cell's)."""
    options, names = plan.options, plan.columns.names
    if options.padding == "stored":
        return None
    grid = plan.grid
    if grid is None:
        return load_padding.spec(plan.columns.sequences, options.pad_value, plan.pad_to, names["length"],
                                 names["bucket"], names["mask"] if options.mask else None)
    return load_padding.spec(plan.columns.sequences, options.pad_value,
                             [grid.pad_to(cell) or (None, None) for cell in range(grid.cells)], names["length"],
                             names["bucket"], None, lengths=(names["length"], names["length_2"]))


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
class BucketBatches(SortedBatches):
    """bucket's output batches (ops.regroup.SortedBatches): batch k is batch `index[k]` of bucket `bucket[k]`."""

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
        return cls(plan, schema, streams, cuts, bucket, index, firsts_of(sizes))

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
        spec = [(k, b, int(cut[b].sizes[j]), (int(cut[b].pad[j]), None if cut[b].pad_2 is None else int(cut[b].pad_2[j])),
                 None if cut[b].quotas is None else tuple(int(q) for q in cut[b].quotas[j])) for k, b, j in batches]
        balance = plan.balance
        return BucketReader(self.schema, plan.columns, dict(plan.pad_values), plan.options.mask,
                            plan.options.padding == "stored", plan.seed,
                            None if balance is None else balance.oversample, {b: self.streams[b] for b in used},
                            begins, spec)


@dataclass(frozen=True)
class BucketReader:
    """A run of bucket's output batches, read and padded on a worker from the sorted streams (SortedBatches.reader),
    each carrying its rows' example ids (batchtool.io.example_ids)."""

    schema: pa.Schema
    columns: BucketColumns
    pad_values: dict[str, Any]
    mask: bool
    padded: bool
    """--padding stored: batches written padded (else at their real lengths)."""
    seed: int
    oversample: bool | None
    """--balance: whether classes cycle (None: not balanced)."""
    streams: dict[int, list[SortedStream]]
    begins: dict[int, tuple[int, ...]]
    """Per bucket, the row of its stream (with --balance, of each class's) where the run's rows begin."""
    batches: list[tuple[int, int, int, tuple[int, int | None], tuple[int, ...] | None]]
    """(output index, bucket, rows, padded lengths (the second's None with one length), quotas per class) of each
    batch."""

    def __call__(self) -> Iterator[pa.RecordBatch]:
        if self.oversample is None:
            rows = self._cut()
        else:
            rows = self._balanced()
        for (k, b, _, (pad, pad_2), _), data in zip(self.batches, rows):
            yield carry(make_batch(data.data, k, b, pad if self.padded else None, self.columns, self.pad_values,
                                   self.mask, pad_2 if self.padded else None), data.ids)

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
