"""Pipeline stages: each operation's plan, per-chunk functions and writer behind one small interface.

A stage reads its input as a Dataset (the source, or a view of what the stages before it produce,
see execute.StageInput), so the operations' own first passes and writers run on it unchanged.
Row stages (filter, select, rename, stratify, resample) map chunks to chunks as they stream; a stage
whose op reorders (Kind.REORDERS: shuffle) is a barrier, regrouped before it emits (the global shuffle
spills everything, the buffered one streams); bucket, pack, segment and batching stratify/shuffle only
ever run last, through their own writers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import stats as stats_mod
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.job import JobResult, RunSettings
from batchtool.driver import Applied, EngineRuntime, emit_nonempty, make_plan, write_regrouped
from batchtool.ops import OPERATIONS
from batchtool.ops import bucket as bucket_op
from batchtool.ops import pack as pack_op
from batchtool.ops import segment as segment_op
from batchtool.ops import stratify as stratify_op
from batchtool.ops.base import Depends, Kind, Operation, Regrouped, need_columns
from batchtool.ops.boundaries import assign_buckets, expected_efficiency
from batchtool.output import OutputOptions
from batchtool.pipeline import config as config_mod
from batchtool.stratify_writer import labels_counted, resolve, write_stratified

Columns = list[str] | None
"""Column names, or None for all of them."""
Stream = Iterator[tuple[Chunk, int]]
"""A stage's output chunks in order (possibly empty), each with the input rows it consumed."""
Write = Callable[..., JobResult]

ANY, ORDER, CHUNKS = Depends.ROWS, Depends.ORDER, Depends.CHUNKS
"""What a consumer of a stage's input depends on: nothing but the rows (counts, histograms), their ids and
order, or also how they are cut into chunks (per-chunk updates: stratify --mode online, --running-mean)."""


class Stage:
    """One [[stage]] at run time: its config, the plan its first passes make, and what it reported."""

    barrier = False
    """Regroups its whole input before emitting anything (an op of Kind.REORDERS: shuffle)."""
    sensitivity = ANY
    """What its output depends on besides the rows: ORDER (their ids and order: a shuffle before it matters)
    or CHUNKS (also the chunking)."""

    first_pass_needs = ANY
    """What its first passes depend on besides the rows (ORDER: a shuffle before it must really run)."""
    first_pass_bar = True
    """Show a progress bar for the first passes (False when the operation's own pass shows one)."""

    def __init__(self, config: config_mod.StageConfig, pipeline: config_mod.PipelineConfig) -> None:
        self.config = config
        self.options = config.options
        self.pipeline = pipeline
        self.seed = pipeline.seed
        self.report: dict[str, Any] = {}
        """The stage's statistics, from the last complete pass through it (every complete pass agrees)."""

    @property
    def name(self) -> str:
        return self.config.name

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema this stage writes, given the one it reads; fails on a missing or unusable column."""
        return schema

    def input_columns(self, columns: Columns) -> Columns:
        """The input columns needed to produce these output columns (and to make the stage's decisions)."""
        return columns

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        """The input columns its first passes read; [] when it needs none."""
        return []

    def plan(self, view: Dataset, run: RunSettings) -> None:
        """Run the first passes over `view` and keep the plan."""

    def stream(self, view: Dataset, columns: Columns, run: RunSettings, report: ReadReport) -> Stream:
        raise NotImplementedError(f"{self.name} only runs as the last stage")

    def materialize(self, view: Dataset, run: RunSettings, report: ReadReport,
                    like: Chunk | None = None) -> AbstractContextManager[Regrouped]:
        """A barrier's output, regrouped now: its items through its work are its output chunks. `like`, the
        first chunk of its full input, makes a regrouping of fewer columns cut its output as the full one."""
        raise NotImplementedError(f"{self.name} is not a barrier")

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        """As the last stage: one row group per non-empty output chunk, as `convert` writes."""
        report = ReadReport()
        return write(command=self.config.op, options={}, seed=None, dataset=view, dst=dst, output=output,
                     schema=self.output_schema(view.schema), items=self.stream(view, None, run, report),
                     work=emit_nonempty, stats=lambda: self.report, run=run, report=report)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing."""
        return None, {}

    def preview_columns(self, schema: pa.Schema) -> Columns:
        """Dry run, last stage: the columns of an extra pass that `preview` needs ([]: none)."""
        return []

    def preview(self, view: Dataset, run: RunSettings) -> None:
        """Dry run, last stage: an extra statistics pass for what `expected` reports."""


class OpStage(Stage):
    """A stage derived from an operation definition (batchtool.ops.OPERATIONS): schema, columns, plan,
    kernel and dry run are the op's own; nothing here is per op."""

    def __init__(self, config: config_mod.StageConfig, pipeline: config_mod.PipelineConfig, op: Operation) -> None:
        super().__init__(config, pipeline)
        self.op = op
        self.planned: Any = None

    @property
    def sensitivity(self) -> int:  # type: ignore[override]
        return int(self.op.depends(self.options))

    @property
    def first_pass_needs(self) -> int:  # type: ignore[override]
        return int(self.op.first_pass_depends(self.options))

    @property
    def first_pass_bar(self) -> bool:  # type: ignore[override]
        return self.op.first_pass_desc is None  # else the op's first pass shows its own

    @property
    def barrier(self) -> bool:  # type: ignore[override]
        return self.op.kind_of(self.options) is Kind.REORDERS

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        return self.op.output_schema(self.options, schema)

    def input_columns(self, columns: Columns) -> Columns:
        return self.op.input_columns(self.options, columns)

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        return self.op.first_pass_columns(self.options)

    def plan(self, view: Dataset, run: RunSettings) -> None:
        self.planned = make_plan(self.op, self.options, view, run.threads, self.seed, run.quiet)

    def stream(self, view: Dataset, columns: Columns, run: RunSettings, report: ReadReport) -> Stream:
        applied = Applied(self.op, self.planned)
        yield from applied.stream(view, columns, run.threads, report)
        self.report = applied.report()

    def materialize(self, view: Dataset, run: RunSettings, report: ReadReport,
                    like: Chunk | None = None) -> AbstractContextManager[Regrouped]:
        plan = self.planned if like is None else self.op.cut_like(self.planned, like)
        return self.op.regroup(plan, view, report, EngineRuntime(run.threads, run.quiet, self.name))

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        if self.op.kind_of(self.options) is Kind.ROWS:
            return super().write(view, dst, output, run, write)
        report = ReadReport()
        with self.op.regroup(self.planned, view, report, EngineRuntime(run.threads, run.quiet, self.name)) as out:
            return write_regrouped(write, out, output, desc=f"{self.name}: write", report=report,
                                   command=self.config.op, options={}, seed=None, dataset=view, dst=dst,
                                   schema=self.output_schema(view.schema), run=run)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        return self.op.expected(self.planned, rows_in)


class StratifyStage(Stage):
    """Per-class selection as rows stream by; as the last stage also batch-size and balanced batches."""

    options: stratify_op.StratifyOptions
    strat: stratify_op.Stratification

    @property
    def sensitivity(self) -> int:  # type: ignore[override]
        return int(stratify_op.OP.depends(self.options))

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        return stratify_op.OP.output_schema(self.options, schema)

    def input_columns(self, columns: Columns) -> Columns:
        return stratify_op.OP.input_columns(self.options, columns)

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        return stratify_op.OP.first_pass_columns(self.options)

    @property
    def first_pass_needs(self) -> int:  # type: ignore[override]
        return ORDER if self.options.mode == "exact" else ANY  # the thresholds are keyed hashes of the ids

    def plan(self, view: Dataset, run: RunSettings) -> None:
        self.strat = resolve(view, self.options, self.seed, run.threads)

    def stream(self, view: Dataset, columns: Columns, run: RunSettings, report: ReadReport) -> Stream:
        applied = Applied(stratify_op.OP, self.strat)
        with labels_counted(view, self.strat, run.threads):
            yield from applied.stream(view, columns, run.threads, report)
        self.report = applied.report()

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        return write_stratified(view, self.strat, dst, output, run, seed=self.seed, write=write, who=self.name)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        return stratify_op.OP.expected(self.strat, rows_in)


class BucketStage(Stage):
    """Always last: its first pass (lengths) plans the buckets; the writer scatters, spills and batches."""

    options: bucket_op.BucketOptions
    first_pass_bar = False  # bucket's first pass shows its own
    columns: bucket_op.Columns
    first: bucket_op.FirstPass

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        self.columns = bucket_op.resolve_columns(self.options, schema)
        self.input_schema = schema
        return schema

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        return self.columns.first_pass

    def plan(self, view: Dataset, run: RunSettings) -> None:
        self.first = bucket_op.first_pass(view, self.columns, run, self.options.memory, self.options.known_classes)

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        return bucket_op.write_bucketed(view, self.options, self.columns, self.first, dst, output, run,
                                        seed=self.seed, write=write)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        o, first = self.options, self.first.stats
        plan = bucket_op.make_plan(o, self.columns, first, self.input_schema, bucket_op.row_bytes(None, self.columns),
                                   self.first.classes)
        counts = bucket_op.batchable_counts(first, o)
        if plan.boundaries is not None:
            lengths = np.arange(len(counts))
            rows = np.bincount(assign_buckets(lengths, plan.boundaries), weights=counts, minlength=plan.num_buckets)
        else:
            rows = np.array([first.label_counts.get(b, 0) for b in range(plan.num_buckets)], dtype=np.float64)
        info: dict[str, Any] = {"boundaries": list(plan.boundaries) if plan.boundaries is not None else None,
                                "num_buckets": plan.num_buckets, "examples_per_bucket": rows.astype(int).tolist()}
        rows_out: int | None = None
        if plan.balance is not None:
            batches, written = plan.balance.batches, plan.balance.written
            info.update(batches=sum(batches), batches_per_bucket=batches, batch_rows=[
                layout.batch_size for layout in plan.balance.layouts], class_rows_out=written.sum(axis=0).tolist(),
                examples_dropped_unbalanced=int(np.maximum(plan.balance.available - written, 0).sum()))
            rows_out = int(written.sum())
        elif o.batch_size is not None:
            sizes = np.array([b.batch_size for b in plan.budgets])
            batches = rows // sizes if o.drop_remainder else -(-rows // sizes)
            info["batches"] = int(batches.sum())
            rows_out = int(np.minimum(rows, batches * sizes).sum())
        elif not o.drop_remainder:
            rows_out = int(rows.sum())
        if plan.boundaries is not None:
            info["padding_efficiency"] = expected_efficiency(counts, plan.boundaries)
        return rows_out, info


class PackStage(Stage):
    """Always last: its first pass (lengths) plans the rows; the writer scatters, spills and assembles them."""

    options: pack_op.PackOptions
    first_pass_bar = False  # pack's first pass shows its own
    columns: pack_op.PackColumns
    counts: pack_op.LengthCounts

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        self.columns = pack_op.resolve_columns(self.options, schema)
        self.input_schema = schema
        return pack_op.output_schema(schema, self.columns, self.options)

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        return [self.columns.length]

    def plan(self, view: Dataset, run: RunSettings) -> None:
        self.counts = pack_op.first_pass(view, self.columns, self.options, run)

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        return pack_op.write_packed(view, self.options, self.columns, self.counts, dst, output, run, seed=self.seed,
                                    write=write)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        plan = pack_op.make_plan(self.options, self.columns, self.counts, self.input_schema, self.seed,
                                 bucket_op.row_bytes(None, self.columns))  # type: ignore[arg-type]
        info = pack_op.expected(plan, pack_op.batch_layout(plan))
        return info["rows"], info


class SegmentStage(Stage):
    """Always last: one pass that checks keys, plans lanes and writes; no first pass of its own."""

    options: segment_op.SegmentOptions

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        _need(schema, [self.options.key], "key")
        _need(schema, self.options.sequences, "sequence")
        o = self.options.with_context(schema)
        _need(schema, [*o.context, *o.states.values(), *([o.input_length] if o.input_length else [])], "context")
        return segment_op.make_plan(pa.schema([schema.field(c) for c in o.source_columns]), o).schema

    def write(self, view: Dataset, dst: str, output: OutputOptions, run: RunSettings, write: Write) -> JobResult:
        return segment_op.write_segmented(view, self.options, dst, output, run, memory=self.pipeline.memory,
                                          tmp_dir=self.pipeline.tmp_dir, write=write)

    def preview_columns(self, schema: pa.Schema) -> Columns:
        return [self.options.sequences[0]]

    def preview(self, view: Dataset, run: RunSettings) -> None:
        self.lengths = stats_mod.collect(view, length=self.options.sequences[0], threads=run.threads).length_counts

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        o = self.options
        steps = np.arange(len(self.lengths))
        count = np.maximum(1, -(-steps // o.num_unroll)) if o.pad else steps // o.num_unroll
        segments = int((count * self.lengths).sum())
        batches = -(-segments // (o.batch_size * o.world_size)) * o.world_size
        slots = batches * o.batch_size * o.num_unroll
        return None, {"segments": segments, "batches": batches,
                      "padding_efficiency": round(int((steps * self.lengths).sum()) / slots, 6) if slots else None}


def _need(schema: pa.Schema, columns: list[str] | tuple[str, ...], key: str) -> None:
    need_columns(schema, key, columns)


STAGES: dict[str, type[Stage]] = {"stratify": StratifyStage, "bucket": BucketStage, "pack": PackStage, "segment": SegmentStage}


def make_stage(config: config_mod.StageConfig, pipeline: config_mod.PipelineConfig) -> Stage:
    if config.op in OPERATIONS:
        return OpStage(config, pipeline, OPERATIONS[config.op])
    return STAGES[config.op](config, pipeline)


__all__ = ["Stage", "make_stage"]
