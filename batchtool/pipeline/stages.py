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
from typing import Any

import pyarrow as pa

from batchtool.io.dataset import Chunk, Dataset, ReadReport
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import Applied, op_plan, stream_errors
from batchtool.core.runner import Executor
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Pass, Scan, Depends, Kind, Operation
from batchtool.pipeline import config as config_mod

Columns = list[str] | None
"""Column names, or None for all of them."""
ChunkStream = Iterator[tuple[Chunk, int]]
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
        return self.op.shape(self._options).kind is Kind.REORDERS

    @property
    def skippable(self) -> bool:
        """A barrier that only reorders (shuffle): a pass that needs no order reads past it. One that also selects
        rows (mix) is never skipped: such a pass streams its kernel instead."""
        return self.barrier and not self.op.reorder_selects

    @property
    def regroups(self) -> bool:
        """Regroups its whole input (a reorder, or an op writing batches: Operation.regroup) rather than mapping
        each chunk."""
        return self.op.shape(self._options).kind is not Kind.ROWS

    @property
    def sensitivity(self) -> int:
        """What its output depends on besides the rows: ORDER (their ids and order: a shuffle before it matters)
        or CHUNKS (also the chunking)."""
        return int(self.op.shape(self._options).depends)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema this stage writes, given the one it reads; fails on a missing or unusable column."""
        return self.op.output_schema(self._options, schema)

    def input_columns(self, columns: Columns) -> Columns:
        """The input columns needed to produce these output columns (and to make the stage's decisions)."""
        return self.op.input_columns(self._options, columns)

    def first_pass(self, schema: pa.Schema) -> Pass | None:
        """Its first pass over an input of this schema (None: it has none)."""
        return self.op.first_pass(self._options, schema)

    def plan(self, view: Dataset, run: RunSettings, executor: Executor) -> None:
        """Run the first passes over `view` on the executor and keep the plan."""
        self._plan = op_plan(self.op, self._options, view, run, executor, self._seed)

    @property
    def planned(self) -> Any:
        """The op's plan, once `plan` has made it (what a regrouping on the workers needs)."""
        return self._plan

    def stream(self, view: Dataset, columns: Columns, executor: Executor, report: ReadReport) -> ChunkStream:
        """A row stage's output chunks (only `columns`), as its kernel makes them on the executor."""
        applied = Applied(self.op, self._plan)
        with stream_errors(view, executor):
            yield from applied.stream(view, columns, executor, report)
        self.report = applied.report()

    def expected(self, rows_in: int | None, scan: Scan) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing (`scan`: a
        pass over some columns of its input)."""
        return self.op.expected(self._plan, rows_in, scan)


__all__ = ["ANY", "CHUNKS", "ORDER", "Columns", "Stage", "ChunkStream"]
