"""The `segment` op's run: its Operation (its declaration, DECLARED, is the package's)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import budget
from batchtool.core.budget import DEFAULT_MEMORY
from batchtool.core.errors import InputError
from batchtool.io.dataset import Chunk, ReadReport
from batchtool.io.output import OutputOptions
from batchtool.io.stats import DatasetStats, chunk_stats
from batchtool.ops.base import Context, Kind, Operation, OutputRows, Scan, need_columns
from batchtool.ops.regroup import Input, Probe, Regrouped, Runtime, Stream
from batchtool.ops.segment import DECLARED
from batchtool.ops.segment.batches import build_batches
from batchtool.ops.segment.chunks import Examples, SegmentPlan, make_plan, prepare_shared
from batchtool.ops.segment.lanes import LANE_WINDOW, LanePlanner
from batchtool.ops.segment.options import SegmentOptions

LANE_BYTES = 1 << 10
"""Planner bookkeeping per lane (its queue, load and heap entry)."""
METADATA_BYTES = 64
"""Metadata per output row (keys, counters), beyond the example's own columns."""
KEYS_SHARE = 4
"""The key check's search for repeats holds at most --memory / KEYS_SHARE, beside the batches still being written."""


def check_memory(options: SegmentOptions, memory: int, sample: pa.RecordBatch | None) -> float:
    """Stop before planning if one step of the plan (a padded batch of B rows for each of the --world-size N ranks,
    which one worker builds together), or the N x B lanes with their window of examples, would not fit the
    budget (sized from a sample chunk); returns the bytes of one step."""
    B, U, N = options.batch_size, options.num_unroll, options.world_size
    per_row, per_step = budget.row_bytes(sample, options.sequence)
    ranks = "" if N == 1 else f" and {{world_size}} {N}"
    rows = f"{B:,} segments" if N == 1 else f"{B:,} segments for each rank ({N * B:,} in all)"
    smaller = "{num_unroll} or {batch_size}" if N == 1 else "{num_unroll}, {batch_size} or {world_size}"
    step = N * B * (U * per_step + per_row + METADATA_BYTES)
    budget.check_fits("num_unroll", f"{{num_unroll}} {U} with {{batch_size}} {B}{ranks}: one batch of {rows} padded to "
                      f"{U:,} steps", step, memory, f"give a smaller {smaller}, or a larger {{memory}}",
                      mentions=("batch_size", "world_size"))
    example = sample.nbytes / sample.num_rows if sample is not None and sample.num_rows else 0.0
    lanes = f"{B:,} lanes" if N == 1 else f"{N * B:,} lanes ({N:,} ranks x {B:,})"
    budget.check_fits("batch_size", f"{lanes}, each planning {LANE_WINDOW} examples ahead",
                      N * B * (LANE_BYTES + LANE_WINDOW * example), memory,
                      "give a smaller {batch_size}" + (" or {world_size}," if N > 1 else "") + " or a larger {memory}",
                      value=B, mentions=("world_size",))
    return step


def _plan(options: SegmentOptions, schema: pa.Schema, memory: int = DEFAULT_MEMORY) -> SegmentPlan:
    """The plan for an input schema: its columns checked, the context resolved, the output schema fixed."""
    need_columns(schema, "key", [options.key])
    need_columns(schema, "sequence", options.sequence)
    o = options.with_context(schema)
    assert o.context is not None
    need_columns(schema, "context", o.context)
    need_columns(schema, "initial_state", list(o.states.values()))
    need_columns(schema, "input_length", [o.input_length] if o.input_length else [])
    return make_plan(pa.schema([schema.field(c) for c in o.source_columns], metadata=schema.metadata), o, memory)


@contextmanager
def _lanes(plan: SegmentPlan, input: Input, sample: pa.RecordBatch | None, runtime: Runtime,
           report: ReadReport) -> Iterator[Regrouped]:
    """The one pass: each chunk checked and its rows and key hashes written to the workspace (on the engine), lanes
    planned from the examples' segment counts as chunks arrive (here), and the planner's items handed to the
    writer, whose workers read the rows they play and build their batches; the keys are checked unique (the
    runtime's distinct-keys check) once the last chunk is read, before the writer finishes. `sample`: the
    columns of the input's first chunk, which the budget is checked on."""
    o = plan.options
    planner = LanePlanner(plan, check_memory(o, plan.memory, sample))
    keys = runtime.distinct(plan.memory // KEYS_SHARE)

    def checked() -> Iterator[Examples]:
        space = None if runtime.executor.shares.memory else runtime.space
        yield from runtime.map_rows(functools.partial(prepare_shared, plan, input.locate, space, keys),
                                    o.source_columns, report)
        _, found = runtime.repeats(keys, [o.key], 1)
        if found:
            raise InputError(f"duplicate key {found[0].row[o.key]!r}: {input.locate(found[0].first)} and "
                             f"{input.locate(found[0].id)} (segment keys must be unique)")

    yield Regrouped(planner.items(checked()), functools.partial(build_batches, plan),
                    lambda: planner.stats.as_dict(plan), sequence_columns=tuple(o.sequence),
                    stacked_rows=None if o.allow_small_batch else o.batch_size)


def _columns(columns: list[str], chunk: Chunk) -> pa.RecordBatch:
    return chunk.data.select(columns)


class SegmentOp(Operation[SegmentOptions, "SegmentPlan"], declared=DECLARED):
    """The op: no first pass; one regrouping pass checks keys, plans lanes and builds the batches."""

    def output_schema(self, options: SegmentOptions, schema: pa.Schema) -> pa.Schema:
        return _plan(options, schema).schema

    def recorded(self, options: SegmentOptions, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        """The options with the context the input decides (every column but the key and sequences by default)."""
        resolved = options.with_context(schema)
        return resolved.manifest_options()

    def plan(self, options: SegmentOptions, context: Context, stats: Any) -> SegmentPlan:
        return _plan(options, context.schema, context.memory)

    def regroup(self, plan: SegmentPlan, input: Input, probe: Probe) -> Stream:
        """Lanes, planned in input order as the examples stream (_lanes), the budget checked on the first chunk (read
        on the driver: a stream's rows are all read again)."""
        sample = probe(functools.partial(_columns, plan.options.source_columns), in_order=True)
        return Stream(functools.partial(_lanes, plan, input, sample))

    def expected(self, plan: SegmentPlan, rows_in: int | None, scan: Scan) -> tuple[int | None, dict[str, Any]]:
        """Segments, batches and padding efficiency from the first sequence column's length histogram (a pass over
        that column)."""
        o = plan.options
        stats = DatasetStats()
        for part in scan([o.sequence[0]], functools.partial(chunk_stats, label=None, length=o.sequence[0])):
            stats.merge(part)
        lengths = stats.length_counts
        steps = np.arange(len(lengths))
        count = np.maximum(1, -(-steps // o.num_unroll)) if o.pad else steps // o.num_unroll
        segments = int((count * lengths).sum())
        batches = -(-segments // (o.batch_size * o.world_size)) * o.world_size
        slots = batches * o.batch_size * o.num_unroll
        return None, {"segments": segments, "batches": batches,
                      "padding_efficiency": round(int((steps * lengths).sum()) / slots, 6) if slots else None}


OP = SegmentOp()

__all__ = ["OP", "SegmentOp", "SegmentOptions", "check_memory"]
