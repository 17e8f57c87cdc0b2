"""`bucket`: group examples by length (or a bucket column) into padded batches, in bounded memory."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool import budget, progress, rng
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.engines import with_engine
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.boundaries import (
    CHOICE_BYTES,
    assign_buckets,
    check_boundaries,
    choose_boundaries,
    efficiency,
    expected_efficiency,
    quantile_boundaries,
    real_elements,
)
from batchtool.output import OutputOptions
from batchtool.padding import mask_column, pad_batch, parse_pad_values, sequence_lengths
from batchtool.ops.quotas import QuotaLayout, plan_layout
from batchtool.ops.rows import RowReader
from batchtool.ops.stratify import (
    MAX_CLASSES,
    LabelError,
    Target,
    check_probs,
    check_zero_classes,
    label_codes,
    target_vector,
)
from batchtool.runner import ordered_map
from batchtool.spill import Spill, interleave, parts_for
from batchtool.stats import DatasetStats, chunk_stats, is_sequence_type, lengths_of

ORDERS = ("shuffle", "sorted")
COSTS = ("linear", "quadratic")
OUTPUT_COLUMNS = ("batch", "bucket", "length", "mask")
RENAMABLE = ("bucket", "length", "mask")
"""Output columns --output-column may name otherwise (`batch` marks the batches for load and check)."""
ORDER_STAGE, INTERLEAVE_STAGE, BALANCE_STAGE = "bucket/order", "bucket/interleave", "bucket/balance"
_MIN_FLUSH_BYTES, _MAX_FLUSH_BYTES = 64 << 10, 4 << 20
_SPILL_ROW_BYTES = 12
"""Per spilled row on top of the data: the uint64 example id and the int32 length."""
BUCKET_BYTES = 1 << 10
"""Bookkeeping per bucket, empty or not: counters, its spill layout and batch stream."""
HISTOGRAM_BYTES = 40
"""Per length up to the longest: the length histogram and the arrays planning derives from it."""


@dataclass(frozen=True)
class BatchBudget:
    """When a batch is full: `batch_size` rows, or a cost of at most `max_tokens` with at most `max_rows`
    rows. The cost is rows x padded length (`linear`, padded elements) or rows x padded length squared
    (`quadratic`, as attention costs); a zero length counts as one. Knows nothing about buckets."""

    batch_size: int | None = None
    max_tokens: int | None = None
    max_rows: int | None = None
    cost: str = "linear"

    def row_cost(self, padded_length: int) -> int:
        """What one row padded to this length costs against --max-tokens."""
        width = max(padded_length, 1)
        return width * width if self.cost == "quadratic" else width

    def fits(self, rows: int, padded_length: int) -> bool:
        if self.batch_size is not None:
            return rows <= self.batch_size
        return (rows * self.row_cost(padded_length) <= self.max_tokens
                and (self.max_rows is None or rows <= self.max_rows))

    def rows_at(self, padded_length: int) -> int:
        """The most rows a batch padded to this length may hold."""
        if self.batch_size is not None:
            return self.batch_size
        rows = self.max_tokens // self.row_cost(padded_length)
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def cut(self, lengths: Iterable[np.ndarray], pad_to: int | None = None) -> np.ndarray:
        """Sizes of the batches, in order, for rows of these lengths arriving in this order.

        Greedy: a batch closes when the next row would not fit (padded to the batch's longest row,
        or to `pad_to`). The last batch holds what is left. Every single row must fit.
        """
        if self.batch_size is not None:
            full, rest = divmod(sum(len(a) for a in lengths), self.batch_size)
            return np.array([self.batch_size] * full + ([rest] if rest else []), dtype=np.int64)
        sizes: list[int] = []
        rows = widest = 0
        for block in lengths:
            for length in block.tolist():
                width = pad_to if pad_to is not None else max(widest, length)
                if rows and not self.fits(rows + 1, width):
                    sizes.append(rows)
                    rows, width = 0, pad_to if pad_to is not None else length
                rows, widest = rows + 1, width
        if rows:
            sizes.append(rows)
        return np.array(sizes, dtype=np.int64)

    def fits_alone(self, padded_lengths: np.ndarray) -> np.ndarray:
        """Per row: does a batch of just this row, padded to this length, fit?"""
        if self.batch_size is not None:
            return np.ones(len(padded_lengths), dtype=bool)
        width = np.maximum(np.asarray(padded_lengths, dtype=np.int64), 1)
        return (width * width if self.cost == "quadratic" else width) <= self.max_tokens

    def is_partial(self, size: int) -> bool:
        """Is a bucket's last batch a remainder? By count: when short; by tokens: always, since the
        bucket ran out before the budget did."""
        return self.batch_size is None or size < self.batch_size


@dataclass(frozen=True)
class BucketOptions:
    """What `bucket` computes; validated on construction (flags named as on the command line)."""

    length: str | None = None
    sequences: tuple[str, ...] = ()
    boundaries: tuple[int, ...] | None = None
    auto_buckets: int | None = None
    bucket_column: str | None = None
    num_buckets: int | None = None
    batch_size: tuple[int, ...] | None = None
    max_tokens: int | None = None
    max_rows: int | None = None
    drop_oversize: bool = False
    pad_to_boundary: bool = False
    pad_values: tuple[str, ...] = ()
    mask: bool = False
    keep: str | None = None
    drop_remainder: bool = False
    order: str = "shuffle"
    memory: int = 1 << 30
    tmp_dir: str | None = None
    cost: str = "linear"
    output_columns: tuple[tuple[str, str], ...] = ()
    balance: str | None = None
    target: Target = "uniform"
    oversample: bool = False

    def __post_init__(self) -> None:
        modes = [flag for flag, value in (("--boundaries", self.boundaries), ("--auto-buckets", self.auto_buckets),
                                          ("--bucket-column", self.bucket_column)) if value is not None]
        if len(modes) != 1:
            raise UsageError("give exactly one of --boundaries, --auto-buckets, --bucket-column"
                             + (f" (got {' and '.join(modes)})" if modes else ""))
        if self.boundaries is not None:
            check_boundaries(self.boundaries)
        if self.auto_buckets is not None and self.auto_buckets < 1:
            raise UsageError(f"--auto-buckets {self.auto_buckets}: must be at least 1")
        if (self.bucket_column is None) != (self.num_buckets is None):
            raise UsageError("--bucket-column and --num-buckets go together")
        if self.num_buckets is not None and self.num_buckets < 1:
            raise UsageError(f"--num-buckets {self.num_buckets}: must be at least 1")
        self._check_batching()
        if self.pad_to_boundary and self.bucket_column is not None:
            raise UsageError("--pad-to-boundary needs length buckets (--boundaries or --auto-buckets), "
                             "not --bucket-column")
        if self.order not in ORDERS:
            raise UsageError(f"--order {self.order!r}: expected {' or '.join(ORDERS)}")
        if self.memory <= 0:
            raise UsageError(f"--memory {self.memory}: must be positive")
        self._check_balance()
        self._check_output_columns()

    def _check_output_columns(self) -> None:
        for role, name in self.output_columns:
            if role not in RENAMABLE or not name:
                raise UsageError(f"--output-column {role}={name}: expected OUT=NAME with OUT one of "
                                 f"{', '.join(RENAMABLE)} and a non-empty NAME")
        roles = [role for role, _ in self.output_columns]
        if len(set(roles)) < len(roles):
            raise UsageError(f"--output-column: {roles[0]} named twice")
        names = list(self.output_names.values())
        if len(set(names)) < len(names):
            raise UsageError(f"--output-column: two output columns would be named "
                             f"{next(n for n in names if names.count(n) > 1)!r}")

    @property
    def output_names(self) -> dict[str, str]:
        """Each output column's name: its own, or the one --output-column gives."""
        return {**{c: c for c in OUTPUT_COLUMNS}, **dict(self.output_columns)}

    def _check_balance(self) -> None:
        if self.balance is None:
            for flag, given in (("--target", self.target != "uniform"), ("--oversample", self.oversample)):
                if given:
                    raise UsageError(f"{flag} goes with --balance LABEL_COLUMN")
            return
        if isinstance(self.target, str) and self.target != "uniform":
            raise UsageError(f"--target {self.target!r}: expected 'uniform', P0,P1,... or CLASS=PROB pairs")
        if not isinstance(self.target, str):
            check_probs(self.target.values() if isinstance(self.target, dict) else self.target, "--target")
        if self.order != "shuffle":
            raise UsageError(f"--balance with --order {self.order}: balanced batches are drawn at random "
                             "(use --order shuffle)")

    @property
    def known_classes(self) -> int | None:
        """--balance: the number of classes a --target list fixes (else the labels seen decide)."""
        return len(self.target) if isinstance(self.target, tuple) else None

    def _check_batching(self) -> None:
        if (self.batch_size is None) == (self.max_tokens is None):
            raise UsageError("give exactly one of --batch-size and --max-tokens")
        for flag, value in (("--max-tokens", self.max_tokens), ("--max-rows", self.max_rows)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} {value}: must be positive")
        if self.max_tokens is None and (self.max_rows is not None or self.drop_oversize):
            raise UsageError(f"{'--max-rows' if self.max_rows is not None else '--drop-oversize'} "
                             "goes with --max-tokens")
        if self.cost not in COSTS:
            raise UsageError(f"--cost {self.cost!r}: expected {' or '.join(COSTS)}")
        if self.cost != "linear" and self.max_tokens is None:
            raise UsageError(f"--cost {self.cost} goes with --max-tokens")
        if self.batch_size is None:
            return
        text = ",".join(str(b) for b in self.batch_size)
        if not self.batch_size or min(self.batch_size) < 1:
            raise UsageError(f"--batch-size {text}: batch sizes must be positive")
        if len(self.batch_size) > 1:
            if self.auto_buckets is not None:
                raise UsageError(f"--batch-size {text}: one size per bucket needs fixed buckets "
                                 "(--boundaries or --bucket-column); --auto-buckets takes one size")
            if len(self.batch_size) != self.bucket_count:
                raise UsageError(f"--batch-size {text}: {len(self.batch_size)} sizes for {self.bucket_count} "
                                 "buckets (give one size, or one per bucket)")

    @property
    def bucket_count(self) -> int | None:
        """Buckets fixed by the options (None for --auto-buckets, which may find fewer distinct lengths)."""
        if self.boundaries is not None:
            return len(self.boundaries) + 1
        return self.num_buckets


@dataclass(frozen=True)
class Columns:
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

    @property
    def first_pass(self) -> list[str]:
        return list(dict.fromkeys(c for c in (self.length, self.bucket, self.keep, self.label) if c is not None))


def resolve_columns(options: BucketOptions, schema: pa.Schema) -> Columns:
    """Check every named column exists with a usable type; default the sequences to all list columns."""
    names = schema.names

    def need(name: str, flag: str, ok: Callable[[pa.DataType], bool], what: str) -> None:
        if name not in names:
            raise SchemaError(f"{flag} {name}: no such column (available: {', '.join(names)})")
        if not ok(schema.field(name).type):
            raise SchemaError(f"{flag} {name}: column is {schema.field(name).type}, expected {what}")

    for name in options.sequences:
        need(name, "--sequence", is_sequence_type, "a list (sequence) column")
    sequences = options.sequences or tuple(f.name for f in schema if is_sequence_type(f.type))
    length = options.length or (sequences[0] if sequences else None)
    if options.length:
        need(options.length, "--length", lambda t: is_sequence_type(t) or pa.types.is_integer(t),
             "an integer or list column")
    elif length is None:
        raise SchemaError("no list column to measure: pass --length with an integer length column")
    if options.bucket_column:
        need(options.bucket_column, "--bucket-column", pa.types.is_integer, "an integer column")
    if options.keep:
        need(options.keep, "--keep", pa.types.is_boolean, "a boolean column")
    if options.balance:
        need(options.balance, "--balance", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
             "integer class labels in [0, num_classes)")
    out = options.output_names
    replaced = tuple(out[c] for c, role in (("length", length), ("bucket", options.bucket_column))
                     if role == out[c] and role not in sequences)
    roles = [c for c in OUTPUT_COLUMNS if c != "mask" or options.mask]
    reused = tuple(c for c in ("length", "bucket") if out[c] in names and out[c] not in replaced
                   and pa.types.is_integer(schema.field(out[c]).type) and out[c] not in sequences
                   and out[c] not in (options.keep, options.balance))
    clash = [c for c in roles if out[c] in names and out[c] not in replaced and c not in reused]
    if clash:
        c = clash[0]
        fix = (f"name bucket's column otherwise with --output-column {c}=NEW_NAME (or rename yours, e.g. convert "
               "--columns)" if c in RENAMABLE else "rename yours first (e.g. convert --columns): batchtool.load "
               "and check find the batches by it")
        raise SchemaError(f"column {out[c]!r} is also an output column of bucket; {fix}")
    return Columns(length, tuple(sequences), options.bucket_column, options.keep,
                   replaced + tuple(out[c] for c in reused), options.balance, out, reused)


@dataclass(frozen=True)
class BucketPlan:
    """Everything the per-chunk and per-batch functions need: a pure function of options and first-pass stats."""

    columns: Columns
    boundaries: tuple[int, ...] | None
    num_buckets: int
    budgets: tuple[BatchBudget, ...]
    pad_to: tuple[int | None, ...]
    """Per bucket: the padded length with --pad-to-boundary (the longest length the bucket admits), else None."""
    pad_values: Mapping[str, Any]
    mask: bool
    drop_oversize: bool
    drop_remainder: bool
    order: str
    parts: tuple[int, ...]
    """Spill parts per group. Shuffle: a group is a bucket; one part of every bucket is held at once, and
    loading the next part of one bucket takes as much again, so together they are sized to half of
    --memory. Sorted: one part per (bucket, length range) group."""
    length_ranges: tuple[int, ...]
    """--order sorted: length edges splitting each bucket into spill groups of at most half of --memory
    (a group is loaded, then sorted into a copy)."""
    defaulted_sequences: bool = False
    balance: Balance | None = None

    @property
    def groups_per_bucket(self) -> int:
        return len(self.length_ranges) + 1

    def padded_length(self, bucket: int, lengths: np.ndarray) -> int:
        """A batch's padded length: the bucket's boundary, or the batch's longest row (the last,
        unbounded bucket always uses the batch's longest row)."""
        fixed = self.pad_to[bucket]
        return fixed if fixed is not None else int(np.max(lengths, initial=0))


@dataclass(frozen=True)
class Balance:
    """--balance: per bucket, the balanced batch layout of the bucket's class counts. Rows per
    batch are the budget's: --batch-size, or as many rows as --max-tokens allows at the bucket's
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


def make_plan(options: BucketOptions, columns: Columns, stats: DatasetStats, schema: pa.Schema,
              row_bytes: tuple[float, float], classes: np.ndarray | None = None) -> BucketPlan:
    """Boundaries (given or chosen), budgets, padding and the spill layout; `row_bytes` = (per row, per step);
    `classes` is the first pass's (class, length or bucket) counts with --balance."""
    counts = batchable_counts(stats, options)
    if options.boundaries is not None:
        boundaries: tuple[int, ...] | None = tuple(options.boundaries)
    elif options.auto_buckets is not None:
        distinct = int(np.count_nonzero(counts))
        k = min(options.auto_buckets, distinct)
        budget.check(f"--auto-buckets {options.auto_buckets}: choosing {k:,} buckets among {distinct:,} distinct "
                     "lengths", max(0, k - 1) * (distinct + 1) * CHOICE_BYTES, options.memory,
                     "give a smaller --auto-buckets (or fixed --boundaries)")
        boundaries = choose_boundaries(counts, options.auto_buckets)
    else:
        boundaries = None
    n = len(boundaries) + 1 if boundaries is not None else options.num_buckets
    flag = f"--num-buckets {n}" if boundaries is None else f"--boundaries ({n - 1:,} values)"
    budget.check(f"{flag}: the bookkeeping of {n:,} buckets", n * BUCKET_BYTES, options.memory,
                 "give fewer buckets")
    sizes = options.batch_size or (None,)
    budgets = tuple(BatchBudget(batch_size=sizes[b % len(sizes)], max_tokens=options.max_tokens,
                                max_rows=options.max_rows, cost=options.cost) for b in range(n))
    pad_to: tuple[int | None, ...] = (None,) * n
    if options.pad_to_boundary:
        pad_to = (*(b - 1 for b in boundaries), None)
    pad_values = parse_pad_values(options.pad_values, schema)
    unpadded = sorted(set(pad_values) - set(columns.sequences))
    if unpadded:
        raise UsageError(f"--pad-value {unpadded[0]}=...: column {unpadded[0]!r} is not padded "
                         f"(sequence columns: {', '.join(columns.sequences) or 'none'})")
    balance = None
    if classes is not None:
        fixed = np.array([-1 if p is None else p for p in pad_to])
        named = max(options.target) + 1 if isinstance(options.target, dict) and options.target else 0
        k = options.known_classes or max(1, classes.shape[0], named)
        batchable = classes if boundaries is None else classes[:, : len(counts)]
        balance = make_balance(options, class_counts(batchable, k, boundaries, n), budgets,
                               np.where(fixed >= 0, fixed, bucket_longest(stats, options, boundaries, n)[1]))
    if balance is not None:
        ranges = ()
        k = balance.num_classes
        share = balance.available / np.maximum(1, balance.available.sum(axis=1, keepdims=True))
        parts = tuple(parts_for(bytes_ * s, options.memory // (2 * n * k))
                      for bytes_, row in zip(_bucket_bytes(stats, boundaries, n, row_bytes), share) for s in row)
    elif options.order == "shuffle":
        ranges: tuple[int, ...] = ()
        parts = tuple(parts_for(b, options.memory // (2 * n)) for b in _bucket_bytes(stats, boundaries, n, row_bytes))
    else:
        ranges = _length_ranges(stats.length_counts, row_bytes, options.memory // 2)
        parts = (1,) * (n * (len(ranges) + 1))
    plan = BucketPlan(columns, boundaries, n, budgets, pad_to, pad_values, options.mask, options.drop_oversize,
                      options.drop_remainder, options.order, parts, ranges, defaulted_sequences=not options.sequences,
                      balance=balance)
    check_largest_batch(plan, options, stats, row_bytes)
    return plan


def check_largest_batch(plan: BucketPlan, options: BucketOptions, stats: DatasetStats,
                        row_bytes: tuple[float, float]) -> None:
    """Stop before batching if one padded batch of some bucket would not fit the budget: its rows (at most
    the bucket's) padded to the bucket's boundary or its longest length, from the first-pass histogram."""
    per_row, per_step = row_bytes
    per_step += 1 if plan.mask else 0
    rows, longest = bucket_longest(stats, options, plan.boundaries, plan.num_buckets)
    for b in np.flatnonzero(rows):
        padded = plan.pad_to[b] if plan.pad_to[b] is not None else int(longest[b])
        limit = plan.budgets[b]
        if limit.batch_size is not None:
            batch_rows = min(int(rows[b]), limit.batch_size)
            elements = batch_rows * padded
            flag = f"--batch-size {limit.batch_size}"
        else:
            batch_rows = min(int(rows[b]), limit.max_rows or limit.max_tokens, limit.max_tokens)
            elements = min(batch_rows * padded, limit.max_tokens)
            flag = f"--max-tokens {limit.max_tokens}"
        fixed = plan.pad_to[b] is not None
        padding = (f"padded to {padded:,} steps (--pad-to-boundary, boundary {padded + 1})" if fixed
                   else f"padded to up to {padded:,} steps")
        fix = f"give a smaller {flag.split()[0]}{', drop --pad-to-boundary' if fixed else ''} or a larger --memory"
        budget.check(f"{flag}: one batch of bucket {b}, {batch_rows:,} rows {padding},",
                     batch_rows * per_row + elements * per_step, options.memory, fix)


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


def row_bytes(sample: pa.RecordBatch | None, columns: Columns) -> tuple[float, float]:
    """(bytes per row, bytes per step) of the spilled rows, measured on a sample chunk."""
    per_row, per_step = budget.row_bytes(sample, columns.sequences)
    return per_row + _SPILL_ROW_BYTES, per_step


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
        if not plan.drop_oversize:
            i = int(np.flatnonzero(oversize)[0])
            padded = plan.padded_length(int(buckets[i]), lengths[i:i + 1])
            limit = plan.budgets[0]
            cost = f" (--cost {limit.cost}: {limit.row_cost(padded):,})" if limit.cost != "linear" else ""
            raise InputError(f"{locate(chunk.ids[i])}: an example of length {lengths[i]} padded to {padded} steps "
                             f"exceeds --max-tokens {limit.max_tokens}{cost} on its own (pass --drop-oversize "
                             "to drop such examples)")
        keep = ~oversize
        chunk, lengths, buckets = chunk.filter(keep), lengths[keep], buckets[keep]
    classes = None
    if plan.balance is not None:
        classes = label_codes(chunk, cols.label, plan.balance.num_classes, locate)
    data = chunk.data.drop_columns(list(cols.replaced)) if cols.replaced else chunk.data
    names = cols.names
    if "length" in cols.reused:
        _check_reused(chunk, names["length"], lengths, "its length", locate)
    if "bucket" in cols.reused:
        _check_reused(chunk, names["bucket"], buckets, "its bucket", locate)
    data = data.append_column(names["length"], pa.array(lengths.astype(np.int32)))
    return Assigned(Chunk(data, chunk.ids), buckets, rows_in, rows_in - kept, int(oversize.sum()), classes)


def _check_reused(chunk: Chunk, column: str, computed: np.ndarray, what: str, locate: Callable[[int], str]) -> None:
    """An input column named like an output column is written once only if it holds what bucket computes."""
    given = pc.fill_null(chunk.data.column(column), -1).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(given != computed)
    if len(bad):
        i = int(bad[0])
        value = chunk.data.column(column)[i].as_py()
        role = "length" if what == "its length" else "bucket"
        raise SchemaError(f"{locate(chunk.ids[i])}, column {column!r}: {value} but {what} is {computed[i]}; "
                          f"bucket writes its own {column!r} column: name it otherwise with "
                          f"--output-column {role}=NEW_NAME (or rename yours, e.g. convert --columns)")


def keep_mask(chunk: Chunk, keep: str) -> np.ndarray:
    """`tf.contrib.training.bucket`'s keep_input: rows whose boolean column is true (null counts as false)."""
    return pc.fill_null(chunk.data.column(keep), False).to_numpy(zero_copy_only=False)


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
            hint = "; pass --sequence to choose the columns to pad" if plan.defaulted_sequences else ""
            raise SchemaError(f"{exc}{hint}") from exc
    lengths = lengths_of(chunk.data, cols.length) if cols.length not in cols.sequences else seq
    if seq is not None and cols.length not in cols.sequences:
        bad = np.flatnonzero(lengths != seq)
        if len(bad):
            i = int(bad[0])
            raise SchemaError(f"{at(i)}: column {cols.length!r} says length {lengths[i]} but sequence column "
                              f"{cols.sequences[0]!r} has {seq[i]} steps")
    if len(lengths) and lengths.min() < 0:
        i = int(np.argmin(lengths))
        raise SchemaError(f"{at(i)}, column {cols.length!r}: negative length {lengths[i]}")
    return lengths


def _bucket_column(chunk: Chunk, column: str, num_buckets: int, locate: Callable[[int], str]) -> np.ndarray:
    arr = chunk.data.column(column)
    values = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero((values < 0) | (values >= num_buckets))
    if len(bad):
        i = int(bad[0])
        shown = "null" if arr[i].as_py() is None else values[i]
        raise InputError(f"{locate(chunk.ids[i])}, column {column!r}: bucket {shown} is outside "
                         f"[0, {num_buckets}) (--num-buckets {num_buckets})")
    return values.astype(np.int32)


def _oversize(lengths: np.ndarray, buckets: np.ndarray, plan: BucketPlan) -> np.ndarray:
    """Rows that exceed --max-tokens even alone in a batch (padded to their bucket's boundary, if fixed)."""
    fixed = np.array([-1 if p is None else p for p in plan.pad_to], dtype=np.int64)[buckets]
    return ~plan.budgets[0].fits_alone(np.where(fixed >= 0, fixed, lengths))


def make_batch(data: pa.RecordBatch, index: int, bucket: int, pad_length: int, plan: BucketPlan) -> pa.RecordBatch:
    """One output batch: sequence columns padded to `pad_length`, plus batch, bucket, length (and mask)."""
    padded = pad_batch(data, plan.columns.sequences, pad_length, plan.pad_values)
    n = data.num_rows
    out = plan.columns.names
    names = [name for name in padded.schema.names if name != out["length"]]
    arrays = [padded.column(name) for name in names]
    arrays += [pa.array(np.full(n, index, dtype=np.int64)), pa.array(np.full(n, bucket, dtype=np.int32)),
               data.column(out["length"])]
    names += [out["batch"], out["bucket"], out["length"]]
    if plan.mask:
        arrays.append(mask_column(data.column(out["length"]).to_numpy(), pad_length))
        names.append(out["mask"])
    return pa.RecordBatch.from_arrays(arrays, names=names)


@dataclass(frozen=True)
class BatchItem:
    """One batch on its way to a worker: its output index, bucket, unpadded rows and padded length."""

    index: int
    bucket: int
    rows: Chunk
    pad_length: int


@dataclass
class Tally:
    """What was written and dropped, per bucket; filled by the one thread that forms batches."""

    examples: np.ndarray
    batches: np.ndarray
    real: np.ndarray
    padded: np.ndarray
    rows_in: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"keep": 0, "oversize": 0, "remainder": 0})
    balance: Balance | None = None
    shares: list[np.ndarray] = field(default_factory=list)
    """--balance: (smallest, largest) share of each class over the full batches written."""

    def add_classes(self, labels: pa.Array, num_classes: int) -> None:
        codes = pc.cast(labels, pa.int64()).to_numpy(zero_copy_only=False)
        share = np.bincount(codes, minlength=num_classes) / max(1, len(codes))
        self.shares = [np.minimum(self.shares[0], share), np.maximum(self.shares[1], share)] if self.shares \
            else [share, share]

    @classmethod
    def zeros(cls, num_buckets: int) -> Tally:
        return cls(*(np.zeros(num_buckets, dtype=np.int64) for _ in range(4)))

    def add_batch(self, bucket: int, lengths: np.ndarray, pad_length: int) -> None:
        self.examples[bucket] += len(lengths)
        self.batches[bucket] += 1
        self.real[bucket] += int(lengths.sum())
        self.padded[bucket] += len(lengths) * pad_length

    def bucket_rows(self, plan: BucketPlan) -> list[dict[str, Any]]:
        rows = []
        for b in range(len(self.examples)):
            row: dict[str, Any] = {"bucket": b}
            if plan.boundaries is not None:
                edges = (0, *plan.boundaries, None)
                row["lengths"] = [edges[b], edges[b + 1]]
            row.update(examples=int(self.examples[b]), batches=int(self.batches[b]), real_elements=int(self.real[b]),
                       padded_elements=int(self.padded[b]),
                       padding_efficiency=efficiency(int(self.real[b]), int(self.padded[b])))
            if self.balance is not None:
                row.update(self.balance_row(b))
            rows.append(row)
        return rows

    def balance_row(self, b: int) -> dict[str, Any]:
        """--balance: one bucket's rows per class in and out, dropped and repeated, and its batch size."""
        assert self.balance is not None
        available, written = self.balance.available[b], self.balance.written[b]
        layout = self.balance.layouts[b]
        return {"batch_rows": layout.batch_size, "balanced_batches": layout.batches,
                "partial_batch_quotas": [int(q) for q in layout.partial] if sum(layout.partial) else None,
                "class_rows_in": available.tolist(), "class_rows_out": written.tolist(),
                "class_dropped": np.maximum(available - written, 0).tolist(),
                "class_repeated": np.maximum(written - available, 0).tolist()}

    def balance_summary(self) -> dict[str, Any]:
        """manifest["stats"]["balance"]: the target, class totals and the class shares over batches."""
        assert self.balance is not None
        bal = self.balance
        written, available = bal.written.sum(axis=0), bal.available.sum(axis=0)
        low, high = self.shares or [np.zeros(bal.num_classes)] * 2
        return {"label": bal.label, "num_classes": bal.num_classes, "target": bal.target.tolist(),
                "oversample": bal.oversample, "class_rows_in": available.tolist(), "class_rows_out": written.tolist(),
                "examples_repeated": int(np.maximum(bal.written - bal.available, 0).sum()),
                "batch_share_min": [round(float(v), 6) for v in low],
                "batch_share_max": [round(float(v), 6) for v in high]}


def bucket_stats(plan: BucketPlan, options: BucketOptions, stats: DatasetStats, tally: Tally) -> dict[str, Any]:
    """manifest["stats"]: boundaries, per-bucket table, overall padding efficiency, what was dropped."""
    real, padded = int(tally.real.sum()), int(tally.padded.sum())
    out: dict[str, Any] = {
        "rows_in": tally.rows_in,
        "lengths_in": stats.length_summary(),
        "boundaries": list(plan.boundaries) if plan.boundaries is not None else None,
        "num_buckets": plan.num_buckets,
        "batches": int(tally.batches.sum()),
        "real_elements": real,
        "padded_elements": padded,
        "padding_efficiency": efficiency(real, padded),
        "examples_dropped": dict(tally.dropped),
        "buckets": tally.bucket_rows(plan),
    }
    if tally.balance is not None:
        out["balance"] = tally.balance_summary()
    if options.auto_buckets is not None:
        out["auto_buckets"] = auto_bucket_report(batchable_counts(stats, options), plan.boundaries,
                                                 options.auto_buckets)
    return out


def auto_bucket_report(length_counts: np.ndarray, boundaries: Sequence[int], k: int) -> dict[str, Any]:
    """The chosen boundaries' expected efficiency (every example padded to its bucket's longest), next to
    k equal-count quantile buckets'."""
    quantiles = quantile_boundaries(length_counts, k)
    return {"k": k, "expected_padding_efficiency": expected_efficiency(length_counts, boundaries),
            "quantile_boundaries": list(quantiles),
            "quantile_expected_padding_efficiency": expected_efficiency(length_counts, quantiles)}


@with_engine
def bucket(src: str, dst: str, options: BucketOptions, output: OutputOptions, run: RunSettings = RunSettings(),
           *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """First pass (lengths only) -> plan -> scatter rows to per-bucket spills -> batches in a seeded
    random order across buckets (or length order) -> padded batch shards + manifest."""
    dataset = open_source(src, dst, output, tmp_dir=options.tmp_dir, format=format, skip_corrupt=skip_corrupt)
    columns = resolve_columns(options, dataset.schema)
    first = first_pass(dataset, columns, run, options.memory, options.known_classes)
    return write_bucketed(dataset, options, columns, first, dst, output, run, seed=seed)


def write_bucketed(dataset: Dataset, options: BucketOptions, columns: Columns, first: FirstPass, dst: str,
                   output: OutputOptions, run: RunSettings, *, seed: int,
                   write: Callable[..., JobResult] = write_job) -> JobResult:
    """Everything after the first pass (`write` is write_job, or a wrapper when bucket ends a pipeline)."""
    sample = next(iter(dataset.tasks()), None)
    sizes_of = row_bytes(sample().data if sample else None, columns)
    plan = make_plan(options, columns, first.stats, dataset.schema, sizes_of, first.classes)
    report = ReadReport()
    tally = Tally.zeros(plan.num_buckets)
    schema = spill_schema(dataset.schema, columns)
    flush, lengths_schema = flush_bytes(plan, options.memory), pa.schema([schema.field(columns.names["length"])])
    with Spill(schema, plan.parts, seed, ORDER_STAGE, options.tmp_dir, flush) as spill, \
            Spill(lengths_schema, plan.parts, seed, ORDER_STAGE, options.tmp_dir, flush) as lengths:
        scatter(dataset, plan, spill, lengths, tally, run, report)
        if plan.balance is None:
            sizes = [batch_sizes(lengths, plan, b, tally) for b in range(plan.num_buckets)]
            streams = [take_sizes(ordered_rows(spill, plan, b), sizes[b], schema) for b in range(plan.num_buckets)]
            counts = [len(s) for s in sizes]
            total = int(sum(int(s.sum()) for s in sizes))
        else:
            plan = replace(plan, balance=rebalance(plan, options, spill, tally))
            streams = [balanced_stream(spill, schema, plan.balance, b, seed) for b in range(plan.num_buckets)]
            counts, total = plan.balance.batches, int(plan.balance.written.sum())
        empty = make_batch(pa.RecordBatch.from_pylist([], schema=schema), 0, 0, 0, plan)
        result = write(
            command="bucket", options=_manifest_options(options), seed=seed, dataset=dataset, dst=dst,
            output=output, schema=empty.schema, items=batches(streams, counts, plan, seed, tally),
            work=lambda item: ([make_batch(item.rows.data, item.index, item.bucket, item.pad_length, plan)],
                               item.rows.num_rows),
            stats=lambda: bucket_stats(plan, options, first.stats, tally), run=run, report=report,
            total_rows=total, desc="bucket: write")
    return result


def rebalance(plan: BucketPlan, options: BucketOptions, spill: Spill, tally: Tally) -> Balance:
    """The layouts again from the spill's exact rows per (bucket, class) (the first pass's counts do not know
    which rows --drop-oversize drops); what no batch takes is counted as dropped."""
    assert plan.balance is not None
    k = plan.balance.num_classes
    available = spill.rows.reshape(plan.num_buckets, k)
    rows = [BatchBudget(batch_size=layout.batch_size) for layout in plan.balance.layouts]
    balance = make_balance(options, available, rows, np.zeros(len(rows), dtype=np.int64))
    tally.dropped["unbalanced"] = int(np.maximum(available - balance.written, 0).sum())
    tally.balance = balance
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
    for quotas in balance.layouts[bucket].sequence():
        batch = Chunk.concat([readers[c].take(int(q)) for c, q in enumerate(quotas) if q], schema)
        yield batch.take(np.argsort(rng.permutation_keys(seed, BALANCE_STAGE, batch.ids), kind="stable"))


@dataclass(frozen=True)
class FirstPass:
    """What the first pass learns: the length histogram (and bucket-column counts), and with --balance the
    rows per (class, length), or per (class, bucket) for a bucket column."""

    stats: DatasetStats
    classes: np.ndarray | None = None


def first_pass(dataset: Dataset, columns: Columns, run: RunSettings, memory: int,
               num_classes: int | None = None) -> FirstPass:
    """Length histogram (and bucket-column counts) of the kept rows, reading only the columns that need."""
    length = columns.length
    keep = columns.keep

    def part(task: Callable[[], Chunk]) -> tuple[DatasetStats, np.ndarray | None, int]:
        chunk = task()
        rows = chunk.num_rows
        if keep is not None:
            chunk = chunk.filter(keep_mask(chunk, keep))
        check_longest(chunk, length, memory, dataset.locate)
        joint = None
        if columns.label is not None:
            joint = joint_counts(chunk, columns, num_classes, memory, dataset.locate)
        return chunk_stats(chunk, columns.bucket, length), joint, rows

    total = DatasetStats()
    classes = np.zeros((0, 0), dtype=np.int64) if columns.label is not None else None
    with progress.bar("bucket: lengths", dataset.num_rows, quiet=run.quiet) as bar:
        for stats, joint, rows in ordered_map(part, dataset.tasks(columns.first_pass, ReadReport()), run.threads):
            total.merge(stats)
            if joint is not None:
                classes = _add_counts(classes, joint)
            bar.update(rows)
    return FirstPass(total, classes)


def joint_counts(chunk: Chunk, columns: Columns, num_classes: int | None, memory: int,
                 locate: Callable[[int], str]) -> np.ndarray:
    """--balance: a chunk's rows per (class, length), or per (class, bucket-column value); bucket values
    outside [0, ...) are left for the scatter pass to report."""
    try:
        codes = label_codes(chunk, columns.label, num_classes or MAX_CLASSES, locate)
    except LabelError as exc:
        hint = f" (--target gives {num_classes} classes)" if num_classes else ""
        raise InputError(f"--balance {columns.label}: labels must be integers in [0, {num_classes or MAX_CLASSES})"
                         f"{hint}; first bad label: {exc.first}") from None
    if columns.bucket is not None:
        values = pc.fill_null(chunk.data.column(columns.bucket), -1).to_numpy(zero_copy_only=False).astype(np.int64)
        codes, values = codes[values >= 0], values[values >= 0]
    else:
        values = lengths_of(chunk.data, columns.length)
    if not len(values):
        return np.zeros((0, 0), dtype=np.int64)
    k, width = int(codes.max()) + 1, int(values.max()) + 1
    budget.check(f"--balance {columns.label}: counting {k:,} classes x {width:,} lengths", k * width * 8, memory,
                 "check the label column, or give a larger --memory", error=InputError)
    return np.bincount(codes * width + values, minlength=k * width).reshape(k, width)


def _add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum of two count matrices of any shapes (the smaller zero-padded)."""
    out = np.zeros((max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1])), dtype=np.int64)
    out[: a.shape[0], : a.shape[1]] += a
    out[: b.shape[0], : b.shape[1]] += b
    return out


def check_longest(chunk: Chunk, length: str, memory: int, locate: Callable[[int], str]) -> None:
    """A length (an integer column's value) sizes the length histogram: stop on one too long for the budget,
    naming its row, before the histogram is allocated."""
    lengths = lengths_of(chunk.data, length)
    if len(lengths):
        i = int(np.argmax(lengths))
        budget.check(f"{locate(chunk.ids[i])}, column {length!r}: length {lengths[i]:,} (its length histogram)",
                     (int(lengths[i]) + 1) * HISTOGRAM_BYTES, memory,
                     "check the column, or give a larger --memory", error=InputError)


def spill_schema(schema: pa.Schema, columns: Columns) -> pa.Schema:
    """What is spilled per row: the input columns (less those an output column replaces) and the length."""
    return pa.schema([*(f for f in schema if f.name not in columns.replaced),
                      pa.field(columns.names["length"], pa.int32())])


def flush_bytes(plan: BucketPlan, memory: int) -> int:
    """Spill write buffers (one per group and part) take at most a quarter of --memory together."""
    return max(_MIN_FLUSH_BYTES, min(_MAX_FLUSH_BYTES, memory // (4 * sum(plan.parts))))


def spill_groups(buckets: np.ndarray, lengths: np.ndarray, plan: BucketPlan,
                 classes: np.ndarray | None = None) -> np.ndarray:
    """Spill group per row: its bucket, with --balance its (bucket, class), or with --order sorted its
    (bucket, length range)."""
    if plan.balance is not None:
        return buckets.astype(np.int64) * plan.balance.num_classes + classes
    if plan.order == "shuffle":
        return buckets
    return buckets.astype(np.int64) * plan.groups_per_bucket + assign_buckets(lengths, plan.length_ranges)


def scatter(dataset: Dataset, plan: BucketPlan, spill: Spill, lengths: Spill, tally: Tally, run: RunSettings,
            report: ReadReport) -> None:
    """The second pass: every kept row to its bucket's spill, in input order (so any --threads gives the
    same files); the lengths alone go to a twin spill with the same groups and parts."""
    with progress.bar("bucket: scatter", dataset.num_rows, quiet=run.quiet) as bar:
        for a in ordered_map(lambda task: assign(task(), plan, dataset.locate), dataset.tasks(None, report),
                             run.threads):
            tally.rows_in += a.rows_in
            tally.dropped["keep"] += a.dropped_keep
            tally.dropped["oversize"] += a.dropped_oversize
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


def ordered_rows(spill: Spill, plan: BucketPlan, bucket: int) -> Iterator[Chunk]:
    """A bucket's rows in output order: keyed random, or ascending length (ties in input order)."""
    if plan.order == "shuffle":
        yield from spill.read_group(bucket)
        return
    first = bucket * plan.groups_per_bucket
    for group in range(first, first + plan.groups_per_bucket):
        for chunk in spill.read_group(group, ordered=False):
            yield chunk.take(np.argsort(chunk.data.column(plan.columns.names["length"]).to_numpy(), kind="stable"))


def batch_sizes(lengths: Spill, plan: BucketPlan, bucket: int, tally: Tally) -> np.ndarray:
    """A bucket's batch sizes, from its lengths in output order (the twin spill orders rows exactly as
    the data spill does); with --drop-remainder the last, partial batch is dropped and counted."""
    budget = plan.budgets[bucket]
    sizes = budget.cut((c.data.column(0).to_numpy() for c in ordered_rows(lengths, plan, bucket)),
                       plan.pad_to[bucket])
    if plan.drop_remainder and len(sizes) and budget.is_partial(int(sizes[-1])):
        tally.dropped["remainder"] += int(sizes[-1])
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


def batches(streams: Sequence[Iterator[Chunk]], counts: Sequence[int], plan: BucketPlan, seed: int,
            tally: Tally) -> Iterator[BatchItem]:
    """Batches in output order: the buckets' batch streams (`counts` batches each) merged in a seeded
    uniformly random interleaving, or one bucket after another with --order sorted."""
    if plan.order == "shuffle":
        merged: Iterator[tuple[int, Chunk]] = interleave(streams, counts, seed, INTERLEAVE_STAGE)
    else:
        merged = itertools.chain.from_iterable(((b, c) for c in s) for b, s in enumerate(streams))
    for index, (b, rows) in enumerate(merged):
        lengths = rows.data.column(plan.columns.names["length"]).to_numpy()
        pad_length = plan.padded_length(b, lengths)
        tally.add_batch(b, lengths, pad_length)
        if plan.balance is not None and rows.num_rows == plan.balance.layouts[b].batch_size:
            tally.add_classes(rows.data.column(plan.balance.label), plan.balance.num_classes)
        yield BatchItem(index, b, rows, pad_length)


def _manifest_options(options: BucketOptions) -> dict[str, Any]:
    out = asdict(options)
    out.pop("tmp_dir")
    return out
