"""What a job writes, described before any batch is made: the job (everything its manifest records), and its output,
either sorted batches any worker can read (ops.regroup.Cut) or a stream of tasks making batches in order (Streamed).
batchtool.exec.write writes it, on the driver or on the workers as the executor's workers share (runner.Shares)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from batchtool.core.run_settings import RunSettings
from batchtool.core.tally import Tally
from batchtool.exec.exchange import ReadUnit
from batchtool.io.dataset import Dataset, ReadReport
from batchtool.io.output import OutputOptions
from batchtool.io.workspace import Workspace
from batchtool.ops.regroup import Cut

Deferred = Callable[[], tuple[list[pa.RecordBatch], int]]
"""Output batches not made yet, and the input rows they complete once made."""
Emitted = Callable[[Any], tuple[Iterable[Deferred], Tally]]
"""A unit's work on one thing it yields (a chunk it read, or an item the driver made): the pieces of output it
makes, in order, and its statistics. A piece is made where its batches are wanted, one at a time (so an op whose
output outgrows its input, in bounded pieces, never holds more than one)."""


@dataclass(frozen=True)
class Job:
    """What one run writes, and how it is recorded: everything but the batches themselves."""

    command: str
    options: dict[str, Any]
    """What the manifest records of the options."""
    seed: int | None
    source: Dataset
    """The input the manifest describes (a pipeline's source, whatever its last stage reads)."""
    dst: str
    output: OutputOptions
    schema: pa.Schema
    run: RunSettings
    who: str | None = None
    """What its progress bars name (a pipeline's stage; None: the command)."""
    started: float = field(default_factory=time.perf_counter)
    manifest_stats: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    """A pipeline's statistics from its last stage's and the rows written; None: the op's own."""
    batches: bool = False
    """Its output is batches (Operation.writes_batches): it is written with its example index
    (batchtool.io.example_index)."""
    numbered: bool = True
    """The example ids its rows carry are `source`'s (False: a pipeline's last stage after the first, whose input's
    rows the stages before numbered anew): what keys its example index without a key column."""

    @property
    def name(self) -> str:
        return self.who or self.command


@dataclass(frozen=True)
class Item:
    """One thing the driver made (a regrouping's item, a chunk with its plan) as a unit: all its task works on."""

    item: Any

    def __call__(self, report: ReadReport) -> Iterator[Any]:
        yield self.item


@dataclass(frozen=True)
class Streamed:
    """Output made as it streams: one task per unit (in order) applies `emitted` to what the unit yields."""

    units: Iterable[ReadUnit]
    emitted: Emitted
    stats: Callable[[], dict[str, Any]]
    """The manifest's statistics once every unit's are merged."""
    merge: Callable[[Tally], None] | None = None
    """Takes each unit's statistics, in input order (None: they have none)."""
    total_rows: int | None = None
    """The input rows the units complete (the progress total); None: the source's."""
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records."""
    stacked_rows: int | None = None
    """Each record batch made holds consecutive batches of this many rows (ops.regroup.Regrouped.stacked_rows)."""


Produced = Cut | Streamed
Produce = Callable[[Workspace, ReadReport], AbstractContextManager[Produced]]
"""produce(workspace, report): the output, made in the workspace (an exchange's sorted batches) or to be made as it
streams, valid while the block is open; `report` takes what the reading skips."""


__all__ = ["Deferred", "Emitted", "Item", "Job", "Produce", "Produced", "Streamed"]
