"""Pipeline stages: each operation's plan, per-chunk functions and writer behind one small interface.

A stage reads its input as a Dataset (the source, or a view of what the stages before it produce,
see execute.StageInput), so the operations' own first passes and writers run on it unchanged.
Every stage is an operation definition (batchtool.ops.OPERATIONS) behind one class, Stage. Row ops
(filter, select, rename, stratify, resample) map chunks to chunks as they stream; an op that reorders
(Kind.REORDERS: shuffle) is a barrier, regrouped before it emits (the global shuffle spills everything,
the buffered one streams); ops that make batches (bucket, pack, segment, stratify or shuffle with a batch
size) only ever run last, through the driver's writer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.job import RunSettings
from batchtool.driver import (Applied, EngineRuntime, dry_run_stats, make_plan, stream_errors)
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Depends, Kind, Operation
from batchtool.ops.regroup import Regrouped
from batchtool.pipeline import config as config_mod

Columns = list[str] | None
"""Column names, or None for all of them."""
Stream = Iterator[tuple[Chunk, int]]
"""A stage's output chunks in order (possibly empty), each with the input rows it consumed."""

ANY, ORDER, CHUNKS = Depends.ROWS, Depends.ORDER, Depends.CHUNKS
"""What a consumer of a stage's input depends on: nothing but the rows (counts, histograms), their ids and
order, or also how they are cut into chunks (per-chunk updates: stratify --mode online, --running-mean)."""


class Stage:
    """One [[stage]] at run time: its operation definition (batchtool.ops.OPERATIONS) with the stage's options, the
    plan its first passes made, and what it reported. Every member is what pipeline/execute.py asks of a stage,
    answered by the op: nothing here is per op."""

    def __init__(self, config: config_mod.StageConfig, seed: int) -> None:
        self.name = config.name
        self.op: Operation = OPERATIONS[config.op]
        self._options = config.options
        self._seed = seed
        self._plan: Any = None
        self.report: dict[str, Any] = {}
        """The stage's statistics, from the last complete pass through it (every complete pass agrees)."""

    @property
    def barrier(self) -> bool:
        """Regroups its whole input before emitting anything (an op of Kind.REORDERS: shuffle)."""
        return self.op.kind_of(self._options) is Kind.REORDERS

    @property
    def regroups(self) -> bool:
        """Regroups its whole input (a reorder, or an op writing batches: Operation.regroup) rather than mapping
        each chunk."""
        return self.op.kind_of(self._options) is not Kind.ROWS

    @property
    def sensitivity(self) -> int:
        """What its output depends on besides the rows: ORDER (their ids and order: a shuffle before it matters)
        or CHUNKS (also the chunking)."""
        return int(self.op.depends(self._options))

    @property
    def first_pass_needs(self) -> int:
        """What its first passes depend on besides the rows (ORDER: a shuffle before it must really run)."""
        return int(self.op.first_pass_depends(self._options))

    @property
    def first_pass_bar(self) -> bool:
        """Show a progress bar for the first passes (False when the op's own first pass shows one)."""
        return self.op.first_pass_desc is None

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema this stage writes, given the one it reads; fails on a missing or unusable column."""
        return self.op.output_schema(self._options, schema)

    def input_columns(self, columns: Columns) -> Columns:
        """The input columns needed to produce these output columns (and to make the stage's decisions)."""
        return self.op.input_columns(self._options, columns)

    def first_pass_columns(self, schema: pa.Schema) -> Columns:
        """The input columns its first passes read; [] when it needs none."""
        return self.op.first_pass_input(self._options, schema)

    def plan(self, view: Dataset, run: RunSettings) -> None:
        """Run the first passes over `view` and keep the plan."""
        self._plan = make_plan(self.op, self._options, view, run.threads, self._seed, run.quiet)

    @property
    def planned(self) -> Any:
        """The op's plan, once `plan` has made it (what a regrouping on the workers needs)."""
        return self._plan

    def stream(self, view: Dataset, columns: Columns, run: RunSettings, report: ReadReport) -> Stream:
        """A row stage's output chunks (only `columns`), as its kernel makes them on the engine."""
        applied = Applied(self.op, self._plan)
        with stream_errors(self.op, self._plan, view, run.threads):
            yield from applied.stream(view, columns, run.threads, report)
        self.report = applied.report()

    def materialize(self, view: Dataset, run: RunSettings, report: ReadReport) -> AbstractContextManager[Regrouped]:
        """A barrier's output as it streams (one with no Exchange plan: the buffered shuffle): its items through
        its work are its output chunks."""
        return self.op.regroup(self._plan, view, report, EngineRuntime(run.threads, run.quiet, self.name))

    @property
    def preview_columns(self) -> list[str]:
        """Dry run, last stage: the columns of an extra pass `preview` makes for `expected` ([]: none)."""
        return self.op.dry_run_columns(self._options)

    def preview(self, view: Dataset, run: RunSettings) -> Any:
        """Dry run, last stage: the extra statistics pass over `preview_columns`, for `expected`."""
        return dry_run_stats(self.op, self._options, view, run.threads)

    def expected(self, rows_in: int | None, previewed: Any = None) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing (with
        `previewed`, what `preview` returned, for an op with preview_columns)."""
        return self.op.expected(self._plan, rows_in, previewed)


__all__ = ["ANY", "CHUNKS", "ORDER", "Columns", "Stage", "Stream"]
