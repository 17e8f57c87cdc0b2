"""bucket's first pass and plan: which columns play which part, the length histogram (and class counts), and the
boundaries, batch budgets, padding, balanced layouts and spill layout made from them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import budget
from batchtool.io.dataset import Chunk
from batchtool.core.errors import OptionError, OptionInputError
from batchtool.ops.base import ColumnError
from batchtool.ops.boundaries import CHOICE_BYTES, assign_buckets, choose_boundaries, real_elements
from batchtool.ops.rows import keep_mask
from batchtool.ops.labels import MAX_CLASSES, LabelError, label_codes
from batchtool.ops.quotas import QuotaLayout, plan_layout
from batchtool.ops.targets import check_zero_classes, target_vector
from batchtool.io.padding import parse_pad_values
from batchtool.ops.keyed import range_bytes
from batchtool.io.spill import parts_for
from batchtool.io.stats import DatasetStats, check_lengths, chunk_stats, is_sequence_type, lengths_of

from batchtool.ops import names as own
from batchtool.ops.bucket.options import OUTPUT_COLUMNS, BucketOptions
from batchtool.ops.bucket.grid import Grid, GridBudget, merge_pairs, pair_counts
from batchtool.ops.batching import BatchBudget

BUCKET_BYTES = 1 << 10
"""Bookkeeping per bucket, empty or not: counters, its spill layout and batch stream."""
BALANCE_GROUP_BYTES = 192
"""--balance: bookkeeping per (bucket, class), each a spill group with its counts, shares and quota layout
(measured: 501 buckets x 2,000 classes took 180 MB more than one class)."""


# -- which columns play which part ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketColumns:
    """Which input columns play which part; resolved from the schema before the first pass."""

    length: str | None
    """The column lengths are read from in the first pass (an integer column or a list column)."""
    sequences: tuple[str, ...]
    """List columns padded to the batch length; they must agree with each other and with `length`."""
    bucket: str | None
    keep: str | None
    replaced: tuple[str, ...]
    """Input columns dropped because an output column of the same name replaces them."""
    label: str | None = None
    """--balance: the class label column."""
    names: Mapping[str, str] = field(default_factory=lambda: {c: c for c in OUTPUT_COLUMNS})
    """The name of each output column (--output-column); the spilled rows carry their length under names["length"]."""
    reused: tuple[str, ...] = ()
    """Output columns ("length", "bucket") an input integer column of the same name already holds: it must
    equal what bucket computes, row by row, and is then written once."""
    second: str | None = None
    """With two --length: the second length's column (the steps of sequences[1]; `length` is sequences[0]'s)."""

    @property
    def first_pass(self) -> list[str]:
        return list(dict.fromkeys(c for c in (self.length, self.second, self.bucket, self.keep, self.label)
                                  if c is not None))


def resolve_columns(options: BucketOptions, schema: pa.Schema) -> BucketColumns:
    """Check every named column exists with a usable type; default the sequences to all list columns."""
    names = schema.names

    def need(name: str, field: str, ok: Callable[[pa.DataType], bool], what: str) -> None:
        if name not in names:
            raise ColumnError(field, f"no such column (available: {', '.join(names)})", value=name)
        if not ok(schema.field(name).type):
            raise ColumnError(field, f"column is {schema.field(name).type}, expected {what}", value=name)

    for name in options.sequence:
        need(name, "sequence", is_sequence_type, "a list (sequence) column")
    for name in options.lengths:
        need(name, "length", lambda t: is_sequence_type(t) or pa.types.is_integer(t), "an integer or list column")
    if options.balance:
        need(options.balance, "balance", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
             "integer class labels in [0, num_classes)")
    if options.grid:
        return _grid_columns(options, schema)
    sequences = options.sequence or tuple(f.name for f in schema if is_sequence_type(f.type))
    length = options.lengths[0] if options.lengths else (sequences[0] if sequences else None)
    if length is None:
        raise ColumnError("length", "no list column to measure: pass {length} with an integer length column")
    if options.bucket_column:
        need(options.bucket_column, "bucket_column", pa.types.is_integer, "an integer column")
    if options.keep:
        need(options.keep, "keep", pa.types.is_boolean, "a boolean column")
    out = options.output_names
    replaced = tuple(out[c] for c, role in (("length", length), ("bucket", options.bucket_column))
                     if role == out[c] and role not in sequences)
    busy = {*replaced, *sequences, options.keep, options.balance}
    reused = tuple(role for role, column in own.adopted(schema, out, ("length", "bucket")).items()
                   if column not in busy)
    written = [c for c in names if c not in replaced and c not in (out[r] for r in reused)]
    own.refuse_clashes("bucket", {c: out[c] for c in OUTPUT_COLUMNS if c not in ("mask", "length_2") or
                                  (c == "mask" and options.mask)}, written)
    return BucketColumns(length, tuple(sequences), options.bucket_column, options.keep,
                         replaced + tuple(out[c] for c in reused), options.balance, out, reused)


def _grid_columns(options: BucketOptions, schema: pa.Schema) -> BucketColumns:
    """Two --length: the i-th length column measures the i-th sequence (by default the length columns themselves,
    when both are list columns); the length and length_2 output columns replace input columns of their names."""
    sequences = options.sequence or tuple(c for c in options.lengths if is_sequence_type(schema.field(c).type))
    if len(sequences) != 2:
        raise ColumnError("sequence", f"{len(sequences)} sequence columns for 2 {{length}} columns: give one "
                          "{sequence} per {length}, in the same order", value=",".join(sequences) or "none",
                          mentions=("length",))
    out = options.output_names
    roles = dict(zip(("length", "length_2"), options.lengths))
    replaced = tuple(out[r] for r, column in roles.items() if column == out[r] and column not in sequences)
    written = [c for c in schema.names if c not in replaced]
    own.refuse_clashes("bucket", {c: out[c] for c in OUTPUT_COLUMNS if c != "mask"}, written)
    return BucketColumns(options.lengths[0], tuple(sequences), None, options.keep, replaced, options.balance, out,
                         second=options.lengths[1])


# -- the first pass ---------------------------------------------------------------------------------------------


@dataclass
class LengthPass:
    """What the first pass learns: the length histogram (and bucket-column counts), and with --balance the
    rows per (class, length), or per (class, bucket) for a bucket column. Chunks' passes merge in input order."""

    stats: DatasetStats = field(default_factory=DatasetStats)
    classes: np.ndarray | None = None
    """--balance: rows per (class, length) or (class, bucket); with two --length the joint histogram with classes,
    (first, second, class, count)."""
    pairs: np.ndarray | None = None
    """With two --length: the exact joint histogram (grid.pair_counts) of the kept rows."""
    memory: int = 0
    """With two --length: --memory, whose share bounds the distinct pairs counted."""

    def merge(self, later: LengthPass) -> None:
        self.stats.merge(later.stats)
        if later.pairs is not None:
            self.memory = max(self.memory, later.memory)
            self.pairs = merge_pairs(self.pairs if self.pairs is not None else later.pairs[:0], later.pairs,
                                     self.memory)
            if later.classes is not None:
                self.classes = merge_pairs(self.classes if self.classes is not None else later.classes[:0],
                                           later.classes, self.memory)
        elif later.classes is not None:
            self.classes = _add_counts(self.classes, later.classes)


def length_pass(options: BucketOptions, columns: BucketColumns, chunk: Chunk, locate: Callable[[int], str],
                memory: int) -> LengthPass:
    """One chunk's length histogram (and bucket-column counts) of the kept rows; with --balance its class counts."""
    if columns.keep is not None:
        chunk = chunk.filter(keep_mask(chunk, columns.keep))
    check_lengths(chunk, columns.length, memory)
    first = LengthPass(chunk_stats(chunk, columns.bucket, columns.length))
    if columns.second is not None:
        check_lengths(chunk, columns.second, memory)
        lengths = (lengths_of(chunk.data, columns.length), lengths_of(chunk.data, columns.second))
        first.memory = memory
        first.pairs = merge_pairs(np.zeros((0, 3), np.int64), pair_counts(*lengths), memory)
        if columns.label is not None:
            codes = class_codes(chunk, columns, options.known_classes, locate)
            first.classes = merge_pairs(np.zeros((0, 4), np.int64), pair_counts(*lengths, codes), memory)
    elif columns.label is not None:
        first.classes = joint_counts(chunk, columns, options.known_classes, memory, locate)
    return first


def class_codes(chunk: Chunk, columns: BucketColumns, num_classes: int | None,
                locate: Callable[[int], str]) -> np.ndarray:
    """--balance: a chunk's class codes; a label outside [0, classes) stops the run naming --balance."""
    try:
        return label_codes(chunk, columns.label, num_classes or MAX_CLASSES, locate)
    except LabelError as exc:
        hint = f" ({{target}} gives {num_classes} classes)" if num_classes else ""
        raise OptionInputError("balance", f"labels must be integers in [0, {num_classes or MAX_CLASSES}){hint}; "
                               f"first bad label: {exc.first}", value=columns.label, mentions=("target",)) from None


def joint_counts(chunk: Chunk, columns: BucketColumns, num_classes: int | None, memory: int,
                 locate: Callable[[int], str]) -> np.ndarray:
    """--balance: a chunk's rows per (class, length), or per (class, bucket-column value); bucket values
    outside [0, ...) are left for the scatter pass to report."""
    codes = class_codes(chunk, columns, num_classes, locate)
    if columns.bucket is not None:
        values = pc.fill_null(chunk.data.column(columns.bucket), -1).to_numpy(zero_copy_only=False).astype(np.int64)
        codes, values = codes[values >= 0], values[values >= 0]
    else:
        values = lengths_of(chunk.data, columns.length)
    if not len(values):
        return np.zeros((0, 0), dtype=np.int64)
    k, width = int(codes.max()) + 1, int(values.max()) + 1
    budget.check_fits("balance", f"counting {k:,} classes x {width:,} lengths", k * width * 8, memory,
                      "check the label column, or give a larger {memory}", value=columns.label, error=OptionInputError)
    return np.bincount(codes * width + values, minlength=k * width).reshape(k, width)


def _add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum of two count matrices of any shapes (the smaller zero-padded)."""
    out = np.zeros((max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1])), dtype=np.int64)
    out[: a.shape[0], : a.shape[1]] += a
    out[: b.shape[0], : b.shape[1]] += b
    return out


# -- the plan ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Balance:
    """--balance: per bucket (with two --length, per cell), the balanced batch layout of the bucket's class counts.
    Rows per batch are the budget's: --batch-size, or as many rows as --max-tokens allows at the bucket's
    longest padded length (so no choice of rows can exceed it)."""

    label: str
    target: np.ndarray
    available: np.ndarray
    """Rows per (bucket, class) after the first pass."""
    layouts: tuple[QuotaLayout, ...]
    oversample: bool

    @property
    def num_classes(self) -> int:
        return len(self.target)

    @property
    def written(self) -> np.ndarray:
        """Rows written per (bucket, class), repeats included."""
        return np.array([layout.per_class for layout in self.layouts], dtype=np.int64).reshape(self.available.shape)

    @property
    def batches(self) -> list[int]:
        return [layout.batches + bool(sum(layout.partial)) for layout in self.layouts]


@dataclass(frozen=True)
class BucketPlan:
    """Everything the per-chunk and per-batch functions need: a pure function of options, seed and first pass."""

    options: BucketOptions
    seed: int
    memory: int
    """--memory, which sizes the spill and bounds a batch and the plan's bookkeeping."""
    tasks: int
    """Key ranges sorted at once (ops.base.Context.tasks): with --memory, what sizes the spill's parts."""
    first: LengthPass
    columns: BucketColumns
    boundaries: tuple[int, ...] | None
    num_buckets: int
    budgets: tuple[BatchBudget, ...]
    pad_to: tuple[int | None, ...]
    """Per bucket: the padded length with --pad-to-boundary (the longest length the bucket admits), else None."""
    pad_values: Mapping[str, Any]
    balance: Balance | None = None
    grid: Grid | None = None
    """With two --length: the cells (a bucket is a cell)."""
    parts: tuple[int, ...] = ()
    """Spill parts per group (`with_spill_layout`). Shuffle: a group is a bucket; one part of every bucket is held
    at once, and loading the next part of one bucket takes as much again, so together they are sized to half of
    --memory. Sorted: one part per (bucket, length range) group."""
    length_ranges: tuple[int, ...] = ()
    """--order sorted: length edges splitting each bucket into spill groups of at most half of --memory
    (a group is loaded, then sorted into a copy)."""

    @property
    def order(self) -> str:
        return self.options.order

    @property
    def groups_per_bucket(self) -> int:
        return len(self.length_ranges) + 1

    def padded_length(self, bucket: int, lengths: np.ndarray) -> int:
        """A batch's padded length: the bucket's boundary, or the batch's longest row (the last,
        unbounded bucket always uses the batch's longest row)."""
        fixed = self.pad_to[bucket]
        return fixed if fixed is not None else int(np.max(lengths, initial=0))

    def rows_per_bucket(self) -> np.ndarray:
        """Batchable rows per bucket (cell), from the first pass."""
        if self.grid is not None:
            return self.grid.cell_rows()
        return bucket_longest(self.first.stats, self.options, self.boundaries, self.num_buckets)[0]


def class_counts(classes: np.ndarray, num_classes: int, boundaries: tuple[int, ...] | None, n: int) -> np.ndarray:
    """Rows per (bucket, class) from the first pass's (class, length) counts, or (class, bucket) counts
    for a bucket column."""
    joint = np.zeros((num_classes, classes.shape[1]), dtype=np.int64)
    joint[: classes.shape[0]] = classes
    if boundaries is None:
        available = np.zeros((n, num_classes), dtype=np.int64)
        available[: min(n, joint.shape[1])] = joint[:, :n].T
        return available
    bucket_of = assign_buckets(np.arange(joint.shape[1]), boundaries)
    return np.stack([np.bincount(bucket_of, weights=row, minlength=n) for row in joint], axis=1).astype(np.int64)


def make_balance(options: BucketOptions, available: np.ndarray, budgets: Sequence[BatchBudget],
                 longest: np.ndarray) -> Balance:
    """The layouts of every bucket from its rows per class (the first pass's, or the spill's exact counts)."""
    target = target_vector(options.target, available.shape[1])
    totals = available.sum(axis=0)
    check_zero_classes(totals / max(1, totals.sum()), target, f"counted in column {options.balance!r}")
    layouts = tuple(plan_layout(available[b], target, budgets[b].rows_at(int(longest[b])),
                                partial=not options.drop_remainder, oversample=options.oversample)
                    for b in range(len(available)))
    return Balance(options.balance, target, available, layouts, options.oversample)


def make_plan(options: BucketOptions, columns: BucketColumns, first: LengthPass, schema: pa.Schema, seed: int,
              memory: int, tasks: int = 1) -> BucketPlan:
    """Boundaries (given or chosen), budgets, padding and, with --balance, the layouts (from the first pass's
    class counts); the spill layout comes later, from a sample of the rows (`with_spill_layout`)."""
    stats = first.stats
    counts = batchable_counts(stats, options)
    if first.pairs is not None:
        return _grid_plan(options, columns, first, schema, seed, memory, tasks)
    if options.boundaries is not None:
        boundaries: tuple[int, ...] | None = tuple(options.boundaries)
    elif options.auto_buckets is not None:
        distinct = int(np.count_nonzero(counts))
        k = min(options.auto_buckets, distinct)
        budget.check_fits("auto_buckets", f"choosing {k:,} buckets among {distinct:,} distinct lengths",
                          max(0, k - 1) * (distinct + 1) * CHOICE_BYTES, memory,
                          "give a smaller {auto_buckets} (or fixed {boundaries})", value=options.auto_buckets,
                          mentions=("boundaries",))
        boundaries = choose_boundaries(counts, options.auto_buckets)
    else:
        boundaries = None
    n = len(boundaries) + 1 if boundaries is not None else options.num_buckets
    field, value = ("num_buckets", f"{n}") if boundaries is None else ("boundaries", f"({n - 1:,} values)")
    budget.check_fits(field, f"the bookkeeping of {n:,} buckets", n * BUCKET_BYTES, memory, "give fewer buckets",
                      value=value)
    sizes = options.batch_size or (None,)
    budgets = tuple(BatchBudget(batch_size=sizes[b % len(sizes)], max_tokens=options.max_tokens,
                                max_rows=options.max_rows, cost=options.cost) for b in range(n))
    pad_to: tuple[int | None, ...] = (None,) * n
    if options.pad_to_boundary:
        pad_to = (*(b - 1 for b in boundaries), None)
    pad_values = parse_pad_values(options.pad_value, schema)
    _check_padded(pad_values, columns)
    balance = None
    if first.classes is not None:
        fixed = np.array([-1 if p is None else p for p in pad_to])
        k = num_classes(options, first.classes.shape[0], n, memory)
        batchable = first.classes if boundaries is None else first.classes[:, : len(counts)]
        balance = make_balance(options, class_counts(batchable, k, boundaries, n), budgets,
                               np.where(fixed >= 0, fixed, bucket_longest(stats, options, boundaries, n)[1]))
    return BucketPlan(options, seed, memory, tasks, first, columns, boundaries, n, budgets, pad_to, pad_values, balance)


def num_classes(options: BucketOptions, seen: int, n: int, memory: int) -> int:
    """--balance: the classes balanced (--target's, else the labels seen), once their bookkeeping in each of the
    n buckets (cells) fits --memory."""
    named = max(options.target) + 1 if isinstance(options.target, dict) and options.target else 0
    k = options.known_classes or max(1, seen, named)
    budget.check_fits("balance", f"balancing {k:,} classes in each of {n:,} buckets", n * k * BALANCE_GROUP_BYTES,
                      memory, "give fewer buckets (or classes), or a larger {memory}", value=options.balance)
    return k


def _grid_plan(options: BucketOptions, columns: BucketColumns, first: LengthPass, schema: pa.Schema, seed: int,
               memory: int, tasks: int) -> BucketPlan:
    """Two --length: the grid --auto-buckets chooses over the batchable rows' joint histogram; every cell's
    batches cut by one budget, padded to their longest row (or with --pad-to-boundary the cell's longest) in each
    dimension."""
    assert first.pairs is not None and options.auto_buckets is not None
    limit = GridBudget(options.batch_size[0] if options.batch_size else None, options.max_tokens, options.max_rows,
                       options.cost, options.cost_coefficients)
    distinct = max((len(np.unique(first.pairs[:, d])) for d in (0, 1)), default=0)
    k = min(options.auto_buckets, max(1, distinct))
    budget.check_fits("auto_buckets", f"choosing {k:,} cells among {distinct:,} distinct lengths",
                      2 * k * (distinct + 1) * CHOICE_BYTES, memory,
                      "give a smaller {auto_buckets}", value=options.auto_buckets)
    grid = Grid.choose(first.pairs, k, limit, options.pad_to_boundary)
    n = grid.cells
    budget.check_fits("auto_buckets", f"the bookkeeping of {n:,} cells", n * BUCKET_BYTES, memory,
                      "give a smaller {auto_buckets}", value=options.auto_buckets)
    pad_values = parse_pad_values(options.pad_value, schema)
    _check_padded(pad_values, columns)
    balance = None
    if first.classes is not None:
        k = num_classes(options, int(first.classes[:, 2].max(initial=-1)) + 1, n, memory)
        balance = make_balance(options, grid.cell_classes(first.classes, k), grid_rows(grid), np.zeros(n, np.int64))
    return BucketPlan(options, seed, memory, tasks, first, columns, None, n, (), (None,) * n, pad_values, balance,
                      grid=grid)


def grid_rows(grid: Grid) -> list[BatchBudget]:
    """--balance on a grid: per cell, the rows of its balanced batches as a fixed batch size (the budget's rows at
    the cell's longest lengths, so no choice of rows can pass --max-tokens)."""
    return [BatchBudget(batch_size=grid.budget.rows_at(int(a), int(b))) for a, b in grid.cell_longest()]


def _check_padded(pad_values: Mapping[str, Any], columns: BucketColumns) -> None:
    """--pad-value names only sequence columns."""
    unpadded = sorted(set(pad_values) - set(columns.sequences))
    if unpadded:
        raise OptionError("pad_value", f"column {unpadded[0]!r} is not padded "
                          f"(sequence columns: {', '.join(columns.sequences) or 'none'})", value=f"{unpadded[0]}=...")


def with_spill_layout(plan: BucketPlan, row_bytes: tuple[float, float]) -> BucketPlan:
    """The plan with its spill layout for rows of these sizes ((per row, per step), see `row_bytes`), once one
    padded batch of every bucket is known to fit --memory."""
    options, stats, n = plan.options, plan.first.stats, plan.num_buckets
    most = range_bytes(plan.memory, plan.tasks)
    sizes = _bucket_bytes(stats, plan.boundaries, n, row_bytes) if plan.grid is None else _cell_bytes(plan.grid, row_bytes)
    if plan.balance is not None:
        ranges: tuple[int, ...] = ()
        k = plan.balance.num_classes
        share = plan.balance.available / np.maximum(1, plan.balance.available.sum(axis=1, keepdims=True))
        parts = tuple(parts_for(bytes_ * s, min(plan.memory // (2 * n * k), most))
                      for bytes_, row in zip(sizes, share) for s in row)
    elif options.order == "shuffle":
        ranges = ()
        parts = tuple(parts_for(b, min(plan.memory // (2 * n), most)) for b in sizes)
    else:
        ranges = _length_ranges(stats.length_counts, row_bytes, min(plan.memory // 2, most))
        parts = (1,) * (n * (len(ranges) + 1))
    if plan.grid is not None:
        check_largest_cell_batch(plan, plan.grid, row_bytes)
    else:
        check_largest_batch(plan, row_bytes)
    return replace(plan, parts=parts, length_ranges=ranges)


def _cell_bytes(grid: Grid, row_bytes: tuple[float, float]) -> np.ndarray:
    """Estimated in-memory bytes per cell: exact rows and first-length steps (which row_bytes' bytes per step,
    both sequences' bytes over the first's steps, is measured against)."""
    per_row, per_step = row_bytes
    return grid.cell_rows() * per_row + grid.cell_steps((0,)) * per_step


def check_largest_cell_batch(plan: BucketPlan, grid: Grid, row_bytes: tuple[float, float]) -> None:
    """Two --length: stop before batching if one padded batch of some cell would not fit --memory: its rows (at
    most the cell's, the budget's and, by tokens, as many as rows of the cheapest cost fit) padded to the cell's
    longest lengths."""
    per_row, per_step = row_bytes
    limit = grid.budget
    rows, longest = grid.cell_rows(), grid.cell_longest()
    for b in np.flatnonzero(rows):
        first, second = (int(v) for v in longest[b])
        most = limit.batch_size if limit.batch_size is not None else min(
            limit.max_rows or int(rows[b]), int(limit.max_tokens // float(limit.row_cost(1, 1))))
        batch_rows = min(int(rows[b]), most)
        field, value = ("batch_size", limit.batch_size) if limit.batch_size is not None else ("max_tokens",
                                                                                            limit.max_tokens)
        budget.check_fits(field, f"one batch of cell {b}, {batch_rows:,} rows padded to up to {first:,} x {second:,} "
                          "steps,", batch_rows * per_row + batch_rows * first * per_step, plan.memory,
                          f"give a smaller {{{field}}} or a larger {{memory}}", value=value)


def check_largest_batch(plan: BucketPlan, row_bytes: tuple[float, float]) -> None:
    """Stop before batching if one padded batch of some bucket would not fit the budget: its rows (at most
    the bucket's) padded to the bucket's boundary or its longest length, from the first-pass histogram."""
    per_row, per_step = row_bytes
    per_step += 1 if plan.options.mask else 0
    rows, longest = bucket_longest(plan.first.stats, plan.options, plan.boundaries, plan.num_buckets)
    for b in np.flatnonzero(rows):
        padded = plan.pad_to[b] if plan.pad_to[b] is not None else int(longest[b])
        limit = plan.budgets[b]
        if limit.batch_size is not None:
            batch_rows = min(int(rows[b]), limit.batch_size)
            elements = batch_rows * padded
            field, value = "batch_size", limit.batch_size
        else:
            batch_rows = min(int(rows[b]), limit.max_rows or limit.max_tokens, limit.max_tokens)
            elements = min(batch_rows * padded, limit.max_tokens)
            field, value = "max_tokens", limit.max_tokens
        fixed = plan.pad_to[b] is not None
        padding = (f"padded to {padded:,} steps ({{pad_to_boundary}}, boundary {padded + 1})" if fixed
                   else f"padded to up to {padded:,} steps")
        fix = f"give a smaller {{{field}}}{', drop {pad_to_boundary}' if fixed else ''} or a larger {{memory}}"
        budget.check_fits(field, f"one batch of bucket {b}, {batch_rows:,} rows {padding},",
                          batch_rows * per_row + elements * per_step, plan.memory, fix, value=value,
                          mentions=("pad_to_boundary",))


def bucket_longest(stats: DatasetStats, options: BucketOptions, boundaries: tuple[int, ...] | None,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket, from the first-pass histogram: its rows and its longest length (for a bucket column,
    the longest length of all)."""
    counts = batchable_counts(stats, options)
    present = np.flatnonzero(counts)
    if boundaries is not None:
        buckets = assign_buckets(present, boundaries)
        rows = np.bincount(buckets, weights=counts[present], minlength=n).astype(np.int64)
        longest = np.zeros(n, dtype=np.int64)
        np.maximum.at(longest, buckets, present)
    else:
        rows = np.array([stats.label_counts.get(b, 0) for b in range(n)], dtype=np.int64)
        longest = np.full(n, int(present.max(initial=0)))
    return rows, longest


def batchable_counts(stats: DatasetStats, options: BucketOptions) -> np.ndarray:
    """The length histogram without lengths over --max-tokens: they can never be batched, so they do not
    shape the buckets (with --drop-oversize they are dropped; without it the run stops on them)."""
    counts = stats.length_counts
    if options.max_tokens is None:
        return counts
    return counts[: (math.isqrt(options.max_tokens) if options.cost == "quadratic" else options.max_tokens) + 1]


def _bucket_bytes(stats: DatasetStats, boundaries: tuple[int, ...] | None, n: int,
                  row_bytes: tuple[float, float]) -> np.ndarray:
    """Estimated in-memory bytes per bucket: exact rows and steps for length buckets; for a bucket
    column, its rows at the mean length."""
    per_row, per_step = row_bytes
    if boundaries is not None:
        counts = stats.length_counts
        values = np.arange(len(counts))
        buckets = assign_buckets(values, boundaries)
        rows = np.bincount(buckets, weights=counts, minlength=n)
        steps = np.bincount(buckets, weights=counts * values, minlength=n)
    else:
        rows = np.array([stats.label_counts.get(b, 0) for b in range(n)], dtype=np.float64)
        steps = rows * (real_elements(stats.length_counts) / max(1, stats.rows))
    return rows * per_row + steps * per_step


def _length_ranges(length_counts: np.ndarray, row_bytes: tuple[float, float], budget: int) -> tuple[int, ...]:
    """Length edges cutting the length axis into runs of about `budget` bytes (a single length is never split)."""
    per_row, per_step = row_bytes
    sizes = length_counts * (per_row + per_step * np.arange(len(length_counts)))
    edges, held = [], 0.0
    for length in np.flatnonzero(length_counts):
        if held and held + sizes[length] > budget:
            edges.append(int(length))
            held = 0.0
        held += sizes[length]
    return tuple(edges)


