"""bucket's second pass and batches: the per-chunk kernel (keep, measure, assign a bucket), the scatter to
per-bucket spills, each bucket's rows in output order cut into batches, and one padded output batch."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import OptionInputError, OptionSchemaError, SchemaError
from batchtool.ops import names as own
from batchtool.ops.base import Runtime
from batchtool.ops.boundaries import assign_buckets
from batchtool.ops.bucket_plan import Balance, BatchBudget, BucketColumns, BucketPlan, make_balance
from batchtool.ops.bucket_report import BucketCounts
from batchtool.ops.filter import keep_mask
from batchtool.ops.labels import label_codes
from batchtool.ops.quotas import quota_batches
from batchtool.ops.rows import RowReader
from batchtool.padding import mask_column, pad_batch, sequence_lengths
from batchtool.spill import Spill, interleave
from batchtool.stats import lengths_of

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
    lengths = measure(chunk, plan, locate)
    if plan.boundaries is not None:
        buckets = assign_buckets(lengths, plan.boundaries)
    else:
        buckets = _bucket_column(chunk, cols.bucket, plan.num_buckets, locate)
    oversize = _oversize(lengths, buckets, plan)
    if oversize.any():
        if not plan.options.drop_oversize:
            i = int(np.flatnonzero(oversize)[0])
            padded = plan.padded_length(int(buckets[i]), lengths[i:i + 1])
            limit = plan.budgets[0]
            cost = f" ({{cost}} {limit.cost}: {limit.row_cost(padded):,})" if limit.cost != "linear" else ""
            raise OptionInputError("max_tokens", f"an example of length {lengths[i]} padded to {padded} steps exceeds "
                                   f"{{max_tokens}} {limit.max_tokens}{cost} on its own (pass {{drop_oversize}} to "
                                   "drop such examples)", mentions=("cost", "drop_oversize"),
                                   where=f"{locate(chunk.ids[i])}: ")
        keep = ~oversize
        chunk, lengths, buckets = chunk.filter(keep), lengths[keep], buckets[keep]
    classes = None
    if plan.balance is not None:
        classes = label_codes(chunk, cols.label, plan.balance.num_classes, locate)
    data = chunk.data.drop_columns(list(cols.replaced)) if cols.replaced else chunk.data
    names = cols.names
    for role, computed in (("length", lengths), ("bucket", buckets)):
        if role in cols.reused:
            own.check_adopted(chunk, names[role], computed, locate, "bucket", role, f"its {role} is {{}}")
    data = data.append_column(names["length"], pa.array(lengths.astype(np.int32)))
    return Assigned(Chunk(data, chunk.ids), buckets, rows_in, rows_in - kept, int(oversize.sum()), classes)


def measure(chunk: Chunk, plan: BucketPlan, locate: Callable[[int], str]) -> np.ndarray:
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
    return pa.schema([*(f for f in schema if f.name not in columns.replaced),
                      pa.field(columns.names["length"], pa.int32())])


def spill_groups(buckets: np.ndarray, lengths: np.ndarray, plan: BucketPlan,
                 classes: np.ndarray | None = None) -> np.ndarray:
    """Spill group per row: its bucket, with --balance its (bucket, class), or with --order sorted its
    (bucket, length range)."""
    if plan.balance is not None:
        return buckets.astype(np.int64) * plan.balance.num_classes + classes
    if plan.order == "shuffle":
        return buckets
    return buckets.astype(np.int64) * plan.groups_per_bucket + assign_buckets(lengths, plan.length_ranges)


def scatter(dataset: Dataset, plan: BucketPlan, spill: Spill, lengths: Spill, counts: BucketCounts,
            runtime: Runtime, report: ReadReport) -> None:
    """The second pass: every kept row to its bucket's spill, in input order (so any --threads gives the
    same files); the lengths alone go to a twin spill with the same groups and parts."""
    with runtime.bar("scatter", dataset.num_rows) as bar:
        for a in runtime.map(lambda task: assign(task(), plan, dataset.locate), dataset.tasks(None, report)):
            counts.rows_in += a.rows_in
            counts.dropped["keep"] += a.dropped_keep
            counts.dropped["oversize"] += a.dropped_oversize
            bar.update(a.rows_in)
            if a.chunk.num_rows:
                row_lengths = a.chunk.data.column(plan.columns.names["length"])
                groups = spill_groups(a.buckets, row_lengths.to_numpy(), plan, a.classes)
                spill.add(a.chunk, groups)
                if plan.balance is None:  # balanced batches take their sizes from the layouts
                    lengths.add(Chunk(pa.record_batch([row_lengths], names=[plan.columns.names["length"]]),
                                      a.chunk.ids), groups)
    spill.finish()
    lengths.finish()


# -- batches: each bucket's rows in output order, cut into batches ---------------------------------------------


def ordered_rows(spill: Spill, plan: BucketPlan, bucket: int) -> Iterator[Chunk]:
    """A bucket's rows in output order: keyed random, or ascending length (ties in input order)."""
    if plan.order == "shuffle":
        yield from spill.read_group(bucket)
        return
    first = bucket * plan.groups_per_bucket
    for group in range(first, first + plan.groups_per_bucket):
        for chunk in spill.read_group(group, ordered=False):
            yield chunk.take(np.argsort(chunk.data.column(plan.columns.names["length"]).to_numpy(), kind="stable"))


def batch_sizes(lengths: Spill, plan: BucketPlan, bucket: int, counts: BucketCounts) -> np.ndarray:
    """A bucket's batch sizes, from its lengths in output order (the twin spill orders rows exactly as
    the data spill does); with --drop-remainder the last, partial batch is dropped and counted."""
    budget = plan.budgets[bucket]
    sizes = budget.cut((c.data.column(0).to_numpy() for c in ordered_rows(lengths, plan, bucket)),
                       plan.pad_to[bucket])
    if plan.options.drop_remainder and len(sizes) and budget.is_partial(int(sizes[-1])):
        counts.dropped["remainder"] += int(sizes[-1])
        sizes = sizes[:-1]
    return sizes


def take_sizes(chunks: Iterator[Chunk], sizes: Sequence[int], schema: pa.Schema) -> Iterator[Chunk]:
    """Cut a stream of chunks into consecutive pieces of exactly these sizes (copying only across chunk edges)."""
    pending: list[Chunk] = []
    held = 0
    for size in sizes:
        while held < size:
            chunk = next(chunks)
            pending.append(chunk)
            held += chunk.num_rows
        last = pending[-1]
        need = size - (held - last.num_rows)
        head = [*pending[:-1], _slice(last, 0, need)]
        yield head[0] if len(head) == 1 else Chunk.concat(head, schema)
        rest = _slice(last, need, last.num_rows)
        pending, held = ([rest], rest.num_rows) if rest.num_rows else ([], 0)


def _slice(chunk: Chunk, start: int, stop: int) -> Chunk:
    return Chunk(chunk.data.slice(start, stop - start), chunk.ids[start:stop])


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


def balanced_stream(spill: Spill, schema: pa.Schema, balance: Balance, bucket: int, seed: int) -> Iterator[Chunk]:
    """A bucket's balanced batches: each takes its quota of every class from the class's rows in keyed order
    (cycling through them again with --oversample), shuffled within the batch by keyed order."""
    k = balance.num_classes

    def rows(c: int) -> Iterator[Chunk]:
        group = bucket * k + c
        yield from spill.read_group(group)
        while balance.oversample and spill.rows[group]:
            yield from spill.read_group(group)

    readers = [RowReader(rows(c), schema) for c in range(k)]
    yield from quota_batches(readers, balance.layouts[bucket].sequence(), seed, BALANCE_STAGE, schema)


@dataclass(frozen=True)
class BatchItem:
    """One batch on its way to a worker: its output index, bucket, unpadded rows and padded length."""

    index: int
    bucket: int
    rows: Chunk
    pad_length: int


def batches(streams: Sequence[Iterator[Chunk]], sizes: Sequence[int], plan: BucketPlan,
            counts: BucketCounts) -> Iterator[BatchItem]:
    """Batches in output order: the buckets' batch streams (`sizes[b]` batches each) merged in a seeded
    uniformly random interleaving, or one bucket after another with --order sorted."""
    if plan.order == "shuffle":
        merged: Iterator[tuple[int, Chunk]] = interleave(streams, sizes, plan.seed, INTERLEAVE_STAGE)
    else:
        merged = itertools.chain.from_iterable(((b, c) for c in s) for b, s in enumerate(streams))
    for index, (b, rows) in enumerate(merged):
        lengths = rows.data.column(plan.columns.names["length"]).to_numpy()
        pad_length = plan.padded_length(b, lengths)
        counts.add_batch(b, lengths, pad_length)
        if plan.balance is not None and rows.num_rows == plan.balance.layouts[b].batch_size:
            counts.add_classes(rows.data.column(plan.balance.label), plan.balance.num_classes)
        yield BatchItem(index, b, rows, pad_length)


# -- one output batch ------------------------------------------------------------------------------------------


def make_batch(data: pa.RecordBatch, index: int, bucket: int, pad_length: int, columns: BucketColumns,
               pad_values: Mapping[str, Any], mask: bool) -> pa.RecordBatch:
    """One output batch: sequence columns padded to `pad_length`, plus batch, bucket, length (and mask)."""
    padded = pad_batch(data, columns.sequences, pad_length, pad_values)
    n = data.num_rows
    out = columns.names
    names = [name for name in padded.schema.names if name != out["length"]]
    arrays = [padded.column(name) for name in names]
    arrays += [pa.array(np.full(n, index, dtype=np.int64)), pa.array(np.full(n, bucket, dtype=np.int32)),
               data.column(out["length"])]
    names += [out["batch"], out["bucket"], out["length"]]
    if mask:
        arrays.append(mask_column(data.column(out["length"]).to_numpy(), pad_length))
        names.append(out["mask"])
    kept = {f.name: f.metadata for f in padded.schema}  # the metadata that marks an extension type's storage
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([pa.field(n, a.type, metadata=kept.get(n))
                                                                for n, a in zip(names, arrays)]))


def batch_work(plan: BucketPlan, item: BatchItem) -> tuple[list[pa.RecordBatch], int]:
    """The writer's work for one batch (on the engine's workers): the padded batch, and the input rows it holds."""
    batch = make_batch(item.rows.data, item.index, item.bucket, item.pad_length, plan.columns, plan.pad_values,
                       plan.options.mask)
    return [batch], item.rows.num_rows


def output_schema(schema: pa.Schema, columns: BucketColumns, mask: bool) -> pa.Schema:
    """The schema bucket writes for an input of this schema: an empty batch's."""
    spilled = spill_schema(schema, columns)
    return make_batch(pa.RecordBatch.from_pylist([], schema=spilled), 0, 0, 0, columns, {}, mask).schema
