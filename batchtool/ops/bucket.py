"""`bucket`: group examples by length (or a bucket column) into padded batches, in bounded memory: its options
and its definition (the plan is in bucket_plan, the batches in bucket_batches, what it reports in bucket_report)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.ops.base import (Choice, Column, ColumnList, Context, Flag, Integer, Kind, Operation, OptionError,
                                Pairs, Regrouped, Runtime, Value, option, shown)
from batchtool.ops.boundaries import check_boundaries, expected_efficiency
from batchtool.ops.bucket_batches import (ORDER_STAGE, balanced_stream, batch_sizes, batch_work, batches,
                                          ordered_rows, output_schema, rebalance, scatter, spill_schema, take_sizes)
from batchtool.ops.bucket_plan import (OUTPUT_COLUMNS, RENAMABLE, BucketPlan, LengthPass, batchable_counts,
                                       flush_bytes, length_pass, make_plan, resolve_columns, row_bytes,
                                       with_spill_layout)
from batchtool.ops.bucket_report import BucketCounts, bucket_stats, summary_lines
from batchtool.ops.stratify_options import TargetSpec, check_probs
from batchtool.ops.stratify_plans import Target
from batchtool.spill import Spill
from batchtool.stats import DatasetStats

if TYPE_CHECKING:
    from batchtool.output import OutputOptions

ORDERS = ("shuffle", "sorted")
COSTS = ("linear", "quadratic")
DEFAULT_MEMORY = 1 << 30


# -- option values ---------------------------------------------------------------------------------------------


class Integers(Value):
    """Integers, comma-separated: `64,128,256` (a TOML integer, a list of integers, or that string)."""

    metavar = "N[,N...]"

    def parse(self, field: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, list) and all(_is_scalar(v) for v in value):
            value = ",".join(str(v) for v in value)
        if not isinstance(value, str):
            raise OptionError(field, f"expected comma-separated integers, got {shown(value)}")
        try:
            return tuple(int(part) for part in value.split(",") if part.strip())
        except ValueError:
            raise OptionError(field, "expected comma-separated integers, e.g. 64,128,256", value=repr(value)) from None


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


# -- options ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketOptions:
    """What `bucket` computes; validated on construction (problems name the option's field)."""

    length: str | None = option("Length to bucket by: an integer column, or a list column's steps "
                                "(default: the first sequence column).", Column(), None)
    sequence: tuple[str, ...] = option("A sequence (list) column to pad; repeat for several, which must agree in "
                                       "length (default: every list column).", ColumnList(dedupe=True), ())
    boundaries: tuple[int, ...] | None = option("Bucket edges b0,b1,...: buckets < b0, [b_i, b_i+1), >= b_last.",
                                                Integers(), None)
    auto_buckets: int | None = option("Choose K buckets from the length distribution to minimise padding.",
                                      Integer(metavar="K"), None)
    bucket_column: str | None = option("Integer column giving each example's bucket (with --num-buckets).",
                                       Column(), None)
    num_buckets: int | None = option("Buckets of --bucket-column: values in [0, N).", Integer(), None)
    batch_size: tuple[int, ...] | None = option("Rows per batch, or one size per bucket.",
                                                Integers(metavar="B[,B...]"), None)
    max_tokens: int | None = option("Instead of --batch-size: at most T padded elements (rows x padded length) "
                                    "per batch.", Integer(metavar="T"), None)
    max_rows: int | None = option("With --max-tokens: also at most this many rows per batch.", Integer(), None)
    cost: str = option("With --max-tokens, what a batch costs: rows x padded length (linear), or rows x padded "
                       "length squared (quadratic, as attention costs), so short buckets get more rows.",
                       Choice(COSTS), "linear")
    drop_oversize: bool = option("Drop (and count) examples that exceed --max-tokens alone, instead of stopping.",
                                 Flag(), False)
    pad_to_boundary: bool = option("Pad to the longest length the bucket admits (boundary - 1), not the batch's "
                                   "longest.", Flag(), False)
    pad_value: tuple[str, ...] = option("Pad value of a sequence column (default 0, '' for strings); repeatable.",
                                        Pairs("COL=V"), ())
    mask: bool = option("Add a 'mask' list<bool> column, true on real steps.", Flag(), False)
    output_column: tuple[tuple[str, str], ...] = option(
        "Name an output column (batch, bucket, length or mask) otherwise, when the input already has a column of "
        "that name; repeatable.",
        Pairs("OUT=NAME", names=True, split=True, example="length=n_steps"), ())
    keep: str | None = option("Boolean column: only rows where it is true are bucketed.", Column(), None)
    drop_remainder: bool = option("Drop (and count) each bucket's last, partial batch.", Flag(), False)
    balance: str | None = option("Every full batch of every bucket holds each class's exact share of the batch "
                                 "(as tf.contrib.training.stratified_sample, but exact per batch); rows no balanced "
                                 "batch can take are dropped and counted.", Column(metavar="LABEL_COL"), None)
    target: Target = option("With --balance: class proportions P0,P1,..., CLASS=PROB pairs, or uniform.",
                            TargetSpec(), "uniform")
    oversample: bool = option("With --balance: repeat rarer classes (keyed, deterministic) instead of dropping rows "
                              "of the common ones.", Flag(), False)
    order: str = option("shuffle: seeded random order within buckets and across batches; sorted: ascending length, "
                        "buckets in order (for inference).", Choice(ORDERS), "shuffle")
    memory: int = DEFAULT_MEMORY
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        modes = ("boundaries", "auto_buckets", "bucket_column")
        given = [name for name in modes if getattr(self, name) is not None]
        if len(given) != 1:
            raise OptionError(given[-1] if given else "boundaries", "give exactly one of {boundaries}, "
                              "{auto_buckets}, {bucket_column}" + (f" (got {' and '.join('{%s}' % m for m in given)})"
                                                                   if given else ""), mentions=modes)
        if self.boundaries is not None:
            check_boundaries(self.boundaries)
        if self.auto_buckets is not None and self.auto_buckets < 1:
            raise OptionError("auto_buckets", "must be at least 1", value=str(self.auto_buckets))
        if (self.bucket_column is None) != (self.num_buckets is None):
            raise OptionError("bucket_column" if self.bucket_column is None else "num_buckets",
                              "{bucket_column} and {num_buckets} go together", mentions=["bucket_column", "num_buckets"])
        if self.num_buckets is not None and self.num_buckets < 1:
            raise OptionError("num_buckets", "must be at least 1", value=str(self.num_buckets))
        self._check_batching()
        if self.pad_to_boundary and self.bucket_column is not None:
            raise OptionError("pad_to_boundary", "{pad_to_boundary} needs length buckets ({boundaries} or "
                              "{auto_buckets}), not {bucket_column}", mentions=modes)
        if self.order not in ORDERS:
            raise OptionError("order", f"expected {' or '.join(ORDERS)}", value=repr(self.order))
        if self.memory <= 0:
            raise OptionError("memory", "must be positive", value=str(self.memory))
        self._check_balance()
        self._check_output_columns()

    def _check_output_columns(self) -> None:
        for role, name in self.output_column:
            if role not in RENAMABLE or not name:
                raise OptionError("output_column", f"expected OUT=NAME with OUT one of {', '.join(RENAMABLE)} and a "
                                  "non-empty NAME", value=f"{role}={name}")
        roles = [role for role, _ in self.output_column]
        if len(set(roles)) < len(roles):
            raise OptionError("output_column", f"{roles[0]} named twice")
        names = list(self.output_names.values())
        if len(set(names)) < len(names):
            raise OptionError("output_column", "two output columns would be named "
                              f"{next(n for n in names if names.count(n) > 1)!r}")

    @property
    def output_names(self) -> dict[str, str]:
        """Each output column's name: its own, or the one --output-column gives."""
        return {**{c: c for c in OUTPUT_COLUMNS}, **dict(self.output_column)}

    def _check_balance(self) -> None:
        if self.balance is None:
            for name, given in (("target", self.target != "uniform"), ("oversample", self.oversample)):
                if given:
                    raise OptionError(name, f"{{{name}}} goes with {{balance}} LABEL_COLUMN", mentions=["balance"])
            return
        if isinstance(self.target, str) and self.target != "uniform":
            raise OptionError("target", "expected 'uniform', P0,P1,... or CLASS=PROB pairs", value=repr(self.target))
        if not isinstance(self.target, str):
            check_probs(self.target.values() if isinstance(self.target, dict) else self.target, "target")
        if self.order != "shuffle":
            raise OptionError("balance", f"{{balance}} with {{order}} {self.order}: balanced batches are drawn at "
                              "random (use {order} shuffle)", mentions=["order"])

    @property
    def known_classes(self) -> int | None:
        """--balance: the number of classes a --target list fixes (else the labels seen decide)."""
        return len(self.target) if isinstance(self.target, tuple) else None

    def _check_batching(self) -> None:
        if (self.batch_size is None) == (self.max_tokens is None):
            raise OptionError("batch_size", "give exactly one of {batch_size} and {max_tokens}",
                              mentions=["max_tokens"])
        for name, value in (("max_tokens", self.max_tokens), ("max_rows", self.max_rows)):
            if value is not None and value < 1:
                raise OptionError(name, "must be positive", value=str(value))
        if self.max_tokens is None and (self.max_rows is not None or self.drop_oversize):
            name = "max_rows" if self.max_rows is not None else "drop_oversize"
            raise OptionError(name, f"{{{name}}} goes with {{max_tokens}}", mentions=["max_tokens"])
        if self.cost not in COSTS:
            raise OptionError("cost", f"expected {' or '.join(COSTS)}", value=repr(self.cost))
        if self.cost != "linear" and self.max_tokens is None:
            raise OptionError("cost", f"{{cost}} {self.cost} goes with {{max_tokens}}", mentions=["max_tokens"])
        if self.batch_size is None:
            return
        text = ",".join(str(b) for b in self.batch_size)
        if not self.batch_size or min(self.batch_size) < 1:
            raise OptionError("batch_size", "batch sizes must be positive", value=text)
        if len(self.batch_size) > 1:
            if self.auto_buckets is not None:
                raise OptionError("batch_size", "one size per bucket needs fixed buckets ({boundaries} or "
                                  "{bucket_column}); {auto_buckets} takes one size", value=text,
                                  mentions=["boundaries", "bucket_column", "auto_buckets"])
            if len(self.batch_size) != self.bucket_count:
                raise OptionError("batch_size", f"{len(self.batch_size)} sizes for {self.bucket_count} buckets (give "
                                  "one size, or one per bucket)", value=text)

    @property
    def bucket_count(self) -> int | None:
        """Buckets fixed by the options (None for --auto-buckets, which may find fewer distinct lengths)."""
        if self.boundaries is not None:
            return len(self.boundaries) + 1
        return self.num_buckets


# -- the operation ---------------------------------------------------------------------------------------------


class Bucket(Operation[BucketOptions, BucketPlan]):
    """bucket's definition: a first pass over the lengths plans the buckets; its regrouping scatters the rows to
    per-bucket spills and gives back padded batches, in a seeded order across buckets."""

    name = "bucket"
    summary = ("Group examples by length into padded batches (tf.contrib.training.bucket / bucket_by_sequence_length)."
               "\n\nEvery batch holds examples of one bucket, padded to one length; batches from all buckets are "
               "written in a seeded random order. DST gets batch, bucket and length columns, and a manifest with "
               "padding efficiency per bucket.")
    example = "batchtool bucket sample_data/parquet /tmp/bucketed --length tokens --auto-buckets 8 --batch-size 32"
    options = BucketOptions
    kind = Kind.BATCHES
    seeded = True
    spills = True
    first_pass_desc = "lengths"

    def output_schema(self, options: BucketOptions, schema: pa.Schema) -> pa.Schema:
        return output_schema(schema, resolve_columns(options, schema), options.mask)

    def recorded(self, options: BucketOptions, output: OutputOptions) -> dict[str, Any]:
        return _manifest_options(options)

    def first_pass_input(self, options: BucketOptions, schema: pa.Schema) -> list[str]:
        """The length column (the input's first list column unless --length names one), --keep, --bucket-column
        and --balance's labels."""
        return resolve_columns(options, schema).first_pass

    def new_stats(self, options: BucketOptions) -> LengthPass:
        return LengthPass(DatasetStats(), np.zeros((0, 0), dtype=np.int64) if options.balance else None)

    def first_pass(self, options: BucketOptions, context: Context, chunk: Chunk) -> LengthPass:
        return length_pass(options, resolve_columns(options, context.schema), chunk, context.locate)

    def plan(self, options: BucketOptions, context: Context, stats: LengthPass | None) -> BucketPlan:
        assert stats is not None
        return make_plan(options, resolve_columns(options, context.schema), stats, context.schema, context.seed)

    @contextmanager
    def regroup(self, plan: BucketPlan, data: Dataset, report: ReadReport,
                runtime: Runtime) -> Iterator[Regrouped]:
        """Scatter every kept row to its bucket's spill (spill parts sized from the first chunk's rows), then each
        bucket's batches (balanced with --balance), merged in a seeded order."""
        sample = next(iter(data.tasks()), None)
        plan = with_spill_layout(plan, row_bytes(sample().data if sample else None, plan.columns))
        n, options = plan.num_buckets, plan.options
        counts = BucketCounts.zeros(n)
        schema = spill_schema(data.schema, plan.columns)
        flush, lengths_schema = flush_bytes(plan, options.memory), pa.schema([schema.field(plan.columns.names["length"])])
        with Spill(schema, plan.parts, plan.seed, ORDER_STAGE, options.tmp_dir, flush) as spill, \
                Spill(lengths_schema, plan.parts, plan.seed, ORDER_STAGE, options.tmp_dir, flush) as lengths:
            scatter(data, plan, spill, lengths, counts, runtime, report)
            if plan.balance is None:
                sizes = [batch_sizes(lengths, plan, b, counts) for b in range(n)]
                streams = [take_sizes(ordered_rows(spill, plan, b), sizes[b], schema) for b in range(n)]
                per_bucket, total = [len(s) for s in sizes], int(sum(int(s.sum()) for s in sizes))
            else:
                plan = replace(plan, balance=rebalance(plan, spill, counts))
                streams = [balanced_stream(spill, schema, plan.balance, b, plan.seed) for b in range(n)]
                per_bucket, total = plan.balance.batches, int(plan.balance.written.sum())
            yield Regrouped(batches(streams, per_bucket, plan, counts), functools.partial(batch_work, plan),
                            functools.partial(bucket_stats, plan, counts), total_rows=total)

    def expected(self, plan: BucketPlan, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        """The buckets' rows from the first pass, and from the plan the batches and rows written (with --max-tokens
        and no --drop-remainder all rows; the batches depend on the order) and the expected padding efficiency."""
        options = plan.options
        rows = plan.rows_per_bucket()
        info: dict[str, Any] = {"boundaries": list(plan.boundaries) if plan.boundaries is not None else None,
                                "num_buckets": plan.num_buckets, "examples_per_bucket": rows.tolist()}
        rows_out: int | None = None
        if plan.balance is not None:
            per_bucket, written = plan.balance.batches, plan.balance.written
            info.update(batches=sum(per_bucket), batches_per_bucket=per_bucket, batch_rows=[
                layout.batch_size for layout in plan.balance.layouts], class_rows_out=written.sum(axis=0).tolist(),
                examples_dropped_unbalanced=int(np.maximum(plan.balance.available - written, 0).sum()))
            rows_out = int(written.sum())
        elif options.batch_size is not None:
            sizes = np.array([b.batch_size for b in plan.budgets])
            full = rows // sizes if options.drop_remainder else -(-rows // sizes)
            info["batches"] = int(full.sum())
            rows_out = int(np.minimum(rows, full * sizes).sum())
        elif not options.drop_remainder:
            rows_out = int(rows.sum())
        if plan.boundaries is not None:
            info["padding_efficiency"] = expected_efficiency(batchable_counts(plan.first.stats, options),
                                                             plan.boundaries)
        return rows_out, info

    def said(self, stats: dict[str, Any]) -> list[str]:
        return summary_lines(stats)


RECORDED_AS = {"sequence": "sequences", "pad_value": "pad_values", "output_column": "output_columns"}
"""Fields the manifest records under the names bucket's options had before they were named after their flags."""
RECORDED_ORDER = ("length", "sequences", "boundaries", "auto_buckets", "bucket_column", "num_buckets", "batch_size",
                  "max_tokens", "max_rows", "drop_oversize", "pad_to_boundary", "pad_values", "mask", "keep",
                  "drop_remainder", "order", "memory", "cost", "output_columns", "balance", "target", "oversample")


def _manifest_options(options: BucketOptions) -> dict[str, Any]:
    """The manifest's options, as bucket has always recorded them: every field but tmp_dir, in their old names
    and order."""
    out = {RECORDED_AS.get(k, k): v for k, v in asdict(options).items() if k != "tmp_dir"}
    return {k: out[k] for k in RECORDED_ORDER}


OP = Bucket()

__all__ = ["COSTS", "ORDERS", "OP", "Bucket", "BucketOptions"]
