"""Whole-dataset statistics from one streaming pass over only the needed columns.

Shared by `inspect`, `check` and every command's first pass: per-chunk partial
statistics are computed on worker threads and merged in order, so memory stays
bounded (label counts and an exact length histogram, never the rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import budget, rng
from batchtool.io.dataset import Chunk, Dataset, ReadReport
from batchtool.core.errors import OptionInputError, SchemaError
from batchtool.core.runner import SERIAL, Executor


HISTOGRAM_ITEM = 8
"""Bytes of the length histogram per length up to the longest (an int64 count)."""


def is_sequence_type(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def lengths_of(batch: pa.RecordBatch, column: str) -> np.ndarray:
    """Per-row length: the value of an integer column, or the number of steps of a list column (null -> 0)."""
    arr = batch.column(column)
    if is_sequence_type(arr.type):
        return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_integer(arr.type):
        return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    raise SchemaError(f"column {column!r} is {arr.type}: a length needs an integer or list column")


@dataclass
class DatasetStats:
    """Mergeable statistics: the rows per shard, label counts, an exact length histogram and, for the
    columns asked, null and NaN counts."""

    rows: int = 0
    shard_rows: dict[int, int] = field(default_factory=dict)
    label_counts: dict = field(default_factory=dict)
    label_nulls: int = 0
    length_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    null_counts: dict[str, int] = field(default_factory=dict)
    """Null values per column (a null list counts once; nulls inside lists are not counted)."""
    nan_counts: dict[str, int] = field(default_factory=dict)
    """NaN values per float column, counting every element inside (nested) list columns."""

    def merge(self, other: DatasetStats) -> None:
        self.rows += other.rows
        for k, v in other.shard_rows.items():
            self.shard_rows[k] = self.shard_rows.get(k, 0) + v
        for k, v in other.label_counts.items():
            self.label_counts[k] = self.label_counts.get(k, 0) + v
        self.label_nulls += other.label_nulls
        self.length_counts = add_counts(self.length_counts, other.length_counts)
        for mine, theirs in ((self.null_counts, other.null_counts), (self.nan_counts, other.nan_counts)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v

    def length_quantile(self, q: float) -> int:
        """Exact q-quantile (lower) of the length distribution."""
        cum = np.cumsum(self.length_counts)
        return int(np.searchsorted(cum, q * cum[-1], side="left")) if len(cum) and cum[-1] else 0

    def length_summary(self) -> dict:
        counts = self.length_counts
        n = int(counts.sum())
        if not n:
            return {"count": 0}
        values = np.nonzero(counts)[0]
        mean = float((np.arange(len(counts)) * counts).sum() / n)
        return {"count": n, "min": int(values[0]), "max": int(values[-1]), "mean": round(mean, 3),
                "p50": self.length_quantile(0.5), "p90": self.length_quantile(0.9),
                "p99": self.length_quantile(0.99), "total": int((np.arange(len(counts)) * counts).sum())}


def add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sum of two histograms of any lengths (the shorter one zero-padded)."""
    if len(a) < len(b):
        a, b = b, a
    out = a.copy()
    out[: len(b)] += b
    return out


def leaf_values(arr: pa.Array) -> pa.Array:
    """The scalar values inside any nesting of lists (only the rows' own: slices and null lists respected)."""
    while is_sequence_type(arr.type):
        arr = arr.flatten()
    return arr


def nan_count(arr: pa.Array, column: str) -> int:
    """NaN values in a float (or list of float) column; a cheap max() pass when there are none."""
    leaf = leaf_values(arr)
    if not pa.types.is_floating(leaf.type):
        raise SchemaError(f"column {column!r} is {arr.type}: counting NaN needs a float or list-of-float column")
    values = (leaf.drop_null() if leaf.null_count else leaf).to_numpy(zero_copy_only=False)
    if not len(values) or not np.isnan(values.max()):  # max() propagates NaN
        return 0
    return int(np.isnan(values).sum())


def chunk_stats(chunk: Chunk, label: str | None, length: str | None, nulls: Sequence[str] = (),
                nans: Sequence[str] = (), histogram: tuple[str, int] | None = None) -> DatasetStats:
    """Statistics of one chunk; a pure function so it can run on any worker thread. `histogram`: (the option,
    bytes) that bound the length histogram, a count per length up to the longest (a value in a file sizes it)."""
    stats = DatasetStats(rows=chunk.num_rows)
    shards, counts = np.unique(chunk.ids >> np.uint64(rng.SHARD_BITS), return_counts=True)
    stats.shard_rows = {int(s): int(c) for s, c in zip(shards, counts)}
    if label is not None:
        arr = chunk.data.column(label)
        stats.label_nulls = arr.null_count
        vc = pc.value_counts(arr.drop_null() if arr.null_count else arr)
        stats.label_counts = dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))
    if length is not None:
        lens = checked_lengths(chunk, length, histogram)
        stats.length_counts = np.bincount(lens) if len(lens) else np.zeros(0, dtype=np.int64)
    stats.null_counts = {c: chunk.data.column(c).null_count for c in nulls}
    stats.nan_counts = {c: nan_count(chunk.data.column(c), c) for c in nans}
    return stats


def checked_lengths(chunk: Chunk, column: str, limit: tuple[str, int] | None,
                    per_length: int = HISTOGRAM_ITEM) -> np.ndarray:
    """A column's lengths (an integer column's values, a list column's steps), checked before they size anything:
    a negative one, or (given `limit`, the option that sets it and its bytes) one whose histogram of `per_length`
    bytes a length up to it would pass the limit, is an error naming its file, row and column."""
    lens = lengths_of(chunk.data, column)
    if not len(lens):
        return lens
    if lens.min() < 0:
        row = int(np.argmax(lens < 0))
        raise SchemaError(f"{chunk.where(row)}, column {column!r}: a negative length ({int(lens[row])})")
    row = int(np.argmax(lens))
    need = per_length * (int(lens[row]) + 1)
    if limit is not None and need > limit[1]:
        field, allowed = limit
        raise OptionInputError(field, f"a length of {int(lens[row]):,}: counting lengths up to it takes {need:,} "
                                      f"bytes, more than {{{field}}} allows ({allowed:,}); check the column, or raise "
                                      f"{{{field}}} if the length is genuine",
                               where=f"{chunk.where(row)}, column {column!r}: ")
    return lens


def check_lengths(chunk: Chunk, column: str, memory: int) -> None:
    """Lengths that size a length histogram and the plans made from it (bucket's first pass, check's length rules):
    checked against --memory's share before it is allocated (budget.HISTOGRAM_BYTES a length)."""
    checked_lengths(chunk, column, ("memory", budget.allowed(memory)), budget.HISTOGRAM_BYTES)


def collect(dataset: Dataset, label: str | None = None, length: str | None = None, executor: Executor = SERIAL,
            report: ReadReport | None = None, nulls: Sequence[str] = (), nans: Sequence[str] = ()) -> DatasetStats:
    """One pass over only the label, length, null and NaN columns (or the narrowest column, to count rows), on the
    executor."""
    columns = list(dict.fromkeys(c for c in (label, length, *nulls, *nans) if c is not None)) \
        or [_narrowest_column(dataset.schema)]
    histogram = histogram_limit(dataset)
    total = DatasetStats()
    for part in executor.map(lambda task: chunk_stats(task(), label, length, nulls, nans, histogram),
                             dataset.tasks(columns, report)):
        total.merge(part)
    return total


def histogram_limit(dataset: Dataset) -> tuple[str, int]:
    """The option, and its bytes, that bound a length histogram of this dataset (chunk_stats' `histogram`)."""
    return (("memory", budget.allowed(dataset.memory)) if dataset.memory is not None
            else ("max_record_bytes", dataset.max_record_bytes))


def _narrowest_column(schema: pa.Schema) -> str:
    """A cheap column to read when only row counts are needed."""
    for f in schema:
        if not is_sequence_type(f.type) and not pa.types.is_struct(f.type):
            return f.name
    return schema.names[0]


def default_label(schema: pa.Schema) -> str | None:
    return "label" if "label" in schema.names and pa.types.is_integer(schema.field("label").type) else None


def default_length(schema: pa.Schema) -> str | None:
    for f in schema:
        if is_sequence_type(f.type):
            return f.name
    return None

