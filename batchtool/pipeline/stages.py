"""Pipeline stages: each operation's plan, per-chunk functions and writer behind one small interface.

A stage reads its input as a Dataset (the source, or a view of what the stages before it produce,
see execute.StageInput), so the operations' own first passes and writers run on it unchanged.
Every stage is an operation definition (batchtool.ops.OPERATIONS) behind one adapter, OpStage. Row ops
(filter, select, rename, stratify, resample) map chunks to chunks as they stream; an op that reorders
(Kind.REORDERS: shuffle) is a barrier, regrouped before it emits (the global shuffle spills everything,
the buffered one streams); ops that make batches (bucket, pack, segment, stratify or shuffle with a batch
size) only ever run last, through the driver's writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.job import JobResult, RunSettings
from batchtool.driver import (Applied, EngineRuntime, dry_run_stats, emit_nonempty, make_plan, stream_errors,
                              write_regrouped)
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Depends, Kind, Operation, Regrouped
from batchtool.output import OutputOptions
from batchtool.pipeline import config as config_mod

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
        self.previewed: Any = None
        """The dry-run pass's merged statistics (an op with dry_run_columns, as the last stage)."""

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
        return self.op.first_pass_input(self.options, schema)

    def plan(self, view: Dataset, run: RunSettings) -> None:
        self.planned = make_plan(self.op, self.options, view, run.threads, self.seed, run.quiet)

    def stream(self, view: Dataset, columns: Columns, run: RunSettings, report: ReadReport) -> Stream:
        applied = Applied(self.op, self.planned)
        with stream_errors(self.op, self.planned, view, run.threads):
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
        with stream_errors(self.op, self.planned, view, run.threads), \
                self.op.regroup(self.planned, view, report, EngineRuntime(run.threads, run.quiet, self.name)) as out:
            return write_regrouped(write, out, output, desc=f"{self.name}: write", report=report,
                                   command=self.config.op, options={}, seed=None, dataset=view, dst=dst,
                                   schema=self.output_schema(view.schema), run=run)

    def preview_columns(self, schema: pa.Schema) -> Columns:
        return self.op.dry_run_columns(self.options)

    def preview(self, view: Dataset, run: RunSettings) -> None:
        self.previewed = dry_run_stats(self.op, self.options, view, run.threads)

    def expected(self, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        if self.op.dry_run_columns(self.options):
            return self.op.expected(self.planned, rows_in, self.previewed)
        return self.op.expected(self.planned, rows_in)




def make_stage(config: config_mod.StageConfig, pipeline: config_mod.PipelineConfig) -> Stage:
    return OpStage(config, pipeline, OPERATIONS[config.op])


__all__ = ["Stage", "make_stage"]
