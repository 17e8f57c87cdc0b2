"""bucket's second pass and batches: the per-chunk kernel (keep, measure, assign a bucket), the scatter to
per-bucket spills, each bucket's rows in output order cut into batches, and one padded output batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.dataset import Chunk
from batchtool.errors import OptionInputError, OptionSchemaError, SchemaError
from batchtool.ops import names as own
from batchtool.ops.boundaries import assign_buckets
from batchtool.ops.bucket_plan import Balance, BatchBudget, BucketColumns, BucketPlan, make_balance
from batchtool.ops.bucket_report import BucketCounts
from batchtool.ops.filter import keep_mask
from batchtool.ops.labels import label_codes
from batchtool.padding import mask_column, pad_batch, sequence_lengths
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


def output_schema(schema: pa.Schema, columns: BucketColumns, mask: bool) -> pa.Schema:
    """The schema bucket writes for an input of this schema: an empty batch's."""
    spilled = spill_schema(schema, columns)
    return make_batch(pa.RecordBatch.from_pylist([], schema=spilled), 0, 0, 0, columns, {}, mask).schema
