"""`segment`: split sequences into `num_unroll`-step segments, batched lane by lane for truncated BPTT.

Each of the B rows of a batch is a lane that plays one example's segments in order in
consecutive batches, then the next example's, so a trainer keeps its recurrent state as a
`[B, ...]` array and resets lane b where `sequence[b] == 0`. This module is the op's definition
(options, plan, the one regrouping pass, dry run); the pass's parts each have their own:
segment_chunks (per-chunk checks and segment counts), segment_keys (the duplicate-key check),
segment_lanes (the sequential lane planner) and segment_batches (building batches on workers).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchtool import budget
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.ops.base import (Column, ColumnList, Context, Flag, Integer, Kind, Operation, OptionError, Pairs,
                                Regrouped, Runtime, need_columns, option)
from batchtool.ops.segment_batches import build_batches
from batchtool.ops.segment_chunks import METADATA, Examples, SegmentPlan, make_plan, prepare_chunk
from batchtool.ops.segment_keys import check_unique_keys, key_index
from batchtool.ops.segment_lanes import LANE_WINDOW, LanePlanner
from batchtool.stats import DatasetStats, chunk_stats

if TYPE_CHECKING:
    from batchtool.output import OutputOptions

DEFAULT_MEMORY = 1 << 30
LANE_BYTES = 1 << 10
"""Planner bookkeeping per lane (its queue, load and heap entry)."""
METADATA_BYTES = 64
"""Metadata per output row (keys, counters), beyond the example's own columns."""


class FlagPair(Flag):
    """On or off, in both forms: `--pad/--no-pad` on the command line, `pad = false` or `no-pad = true` in a
    pipeline file."""

    negatable = True


class Ranks(Integer):
    """A number of training ranks."""

    metavar = "N"


@dataclass(frozen=True)
class SegmentOptions:
    """What to segment and how to batch it (the flags of `batchtool segment`, the keys of a segment stage)."""

    key: str = option("Unique string key of each example (input_key).", Column())
    sequence: tuple[str, ...] = option("Sequence (list) columns sharing one time axis, split into segments "
                                       "(input_sequences).", ColumnList(dedupe=True))
    num_unroll: int = option("Steps per segment (num_unroll).", Integer())
    batch_size: int = option("Rows (lanes) per batch (batch_size).", Integer())
    context: tuple[str, ...] | None = option("Per-example columns copied to every segment (input_context).",
                                             ColumnList(dedupe=True), None)
    """None: every input column the other options do not use (see with_context)."""
    input_length: str | None = option("Integer column of real steps before padding (input_length; default: the "
                                      "sequence length).", Column(), None)
    pad: bool = option("Pad each sequence to a multiple of --num-unroll, or require one (pad).", FlagPair(), True)
    pad_value: tuple[str, ...] = option("Pad value of a sequence column (default 0, False or ''); repeatable.",
                                        Pairs("COL=V"), ())
    initial_state: tuple[str, ...] = option("Write COL's value as column NAME on each example's first segment, zeros "
                                            "on the others (initial_states); repeatable.", Pairs("NAME=COL"), ())
    allow_small_batch: bool = option("Drop the empty rows of the final batches instead of writing padding rows "
                                     "(allow_small_batch).", Flag(), False)
    world_size: int = option("Write N lane-stable streams with equal batch counts, one per training rank (read "
                             "with batchtool.load(DST, rank=r, world_size=N)).", Ranks(), 1)
    """Lane streams written: batch t of rank r is output batch t * world_size + r."""
    memory: int = DEFAULT_MEMORY
    """Bounds the duplicate-key check (a quarter of it before spilling), one padded batch and the lanes' planning."""
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_unroll", "batch_size", "world_size"):
            if getattr(self, name) < 1:
                raise OptionError(name, "must be at least 1", value=str(getattr(self, name)))
        if not self.sequence:
            raise OptionError("sequence", "give at least one sequence (list) column")
        named = (("sequence", self.sequence), ("context", self.context or ()), ("initial_state", tuple(self.states)))
        for field, names in named:
            for name in names:
                if ":" in name:
                    raise OptionError(field, "names may not contain ':' (as in batch_sequences_with_states)",
                                      value=repr(name))
        reserved = [name for name, _ in METADATA]
        seen: dict[str, str] = {}
        for field, names in named:
            for name in names:
                if name in reserved:
                    raise OptionError(field, f"clashes with the metadata column {name!r} (reserved: "
                                      f"{', '.join(reserved)})", value=repr(name))
                if name in seen:
                    raise OptionError(field, f"already given as {{{seen[name]}}} {name!r}; each output column must "
                                      "be named once", value=repr(name), mentions=[seen[name]])
                seen[name] = field
        for spec in self.pad_value:
            name = spec.partition("=")[0]
            if name not in self.sequence:
                raise OptionError("pad_value", f"{name!r} is not a {{sequence}} column (sequences: "
                                  f"{', '.join(self.sequence)})", value=repr(spec), mentions=["sequence"])

    @property
    def states(self) -> dict[str, str]:
        """--initial-state specs as {output name: source column}."""
        out: dict[str, str] = {}
        for spec in self.initial_state:
            name, sep, column = spec.partition("=")
            if not sep or not name or not column:
                raise OptionError("initial_state", "expected NAME=COLUMN", value=repr(spec))
            if name in out:
                raise OptionError("initial_state", f"state {name!r} is given twice", value=repr(spec))
            out[name] = column
        return out

    def with_context(self, schema: pa.Schema) -> SegmentOptions:
        """Without --context, every input column not used otherwise (key, sequences, --input-length,
        --initial-state sources) is context, so no column is dropped unasked; one that would clash
        with an output column is refused by name."""
        if self.context is not None:
            return self
        used = {self.key, *self.sequence, *self.states.values(), self.input_length}
        rest = tuple(name for name in schema.names if name not in used)
        taken = {name for name, _ in METADATA} | set(self.states)
        clashes = [name for name in rest if name in taken]
        if clashes:
            raise OptionError("context", f"input column(s) {', '.join(map(repr, clashes))} would be copied as context "
                              "but clash with segment's output columns; rename them, or name the columns to keep "
                              f"with {{context}} (the others are then not written: {', '.join(rest)})")
        return replace(self, context=rest)

    @property
    def source_columns(self) -> list[str]:
        """The input columns to read, each once (the options with their context resolved)."""
        assert self.context is not None, "source_columns of options with their context resolved"
        cols = [self.key, *self.context, *self.sequence, *self.states.values()]
        if self.input_length:
            cols.append(self.input_length)
        return list(dict.fromkeys(cols))

    def manifest_options(self) -> dict[str, Any]:
        """The manifest's options (named as they always were: sequences, pad_values, initial_states)."""
        return {"key": self.key, "sequences": list(self.sequence), "num_unroll": self.num_unroll,
                "batch_size": self.batch_size, "context": list(self.context or ()), "input_length": self.input_length,
                "pad": self.pad, "pad_values": list(self.pad_value), "initial_states": self.states,
                "allow_small_batch": self.allow_small_batch, "world_size": self.world_size}


def check_memory(options: SegmentOptions, sample: pa.RecordBatch | None) -> float:
    """Stop before planning if one padded batch, or the lanes with their window of examples, would not fit
    the budget (sized from a sample chunk); returns the bytes of one padded batch."""
    B, U, memory = options.batch_size, options.num_unroll, options.memory
    per_row, per_step = budget.row_bytes(sample, options.sequence)
    batch = B * (U * per_step + per_row + METADATA_BYTES)
    budget.check("num_unroll", f"{{num_unroll}} {U} with {{batch_size}} {B}: one batch of {B:,} segments padded to "
                 f"{U:,} steps", batch, memory, "give a smaller {num_unroll} or {batch_size}, or a larger {memory}",
                 mentions=("batch_size",))
    example = sample.nbytes / sample.num_rows if sample is not None and sample.num_rows else 0.0
    budget.check("batch_size", f"{B:,} lanes, each planning {LANE_WINDOW} examples ahead",
                 B * (LANE_BYTES + LANE_WINDOW * example), memory, "give a smaller {batch_size} or a larger {memory}",
                 value=B)
    return batch


def _plan(options: SegmentOptions, schema: pa.Schema) -> SegmentPlan:
    """The plan for an input schema: its columns checked, the context resolved, the output schema fixed."""
    need_columns(schema, "key", [options.key])
    need_columns(schema, "sequence", options.sequence)
    o = options.with_context(schema)
    assert o.context is not None
    need_columns(schema, "context", o.context)
    need_columns(schema, "initial_state", list(o.states.values()))
    need_columns(schema, "input_length", [o.input_length] if o.input_length else [])
    return make_plan(pa.schema([schema.field(c) for c in o.source_columns]), o)


class SegmentOp(Operation[SegmentOptions, SegmentPlan]):
    """The op: no first pass; one regrouping pass checks keys, plans lanes and builds the batches."""

    name = "segment"
    summary = """Split sequences into --num-unroll-step segments and write lane-stable batches for truncated BPTT.

    Row b of every batch is lane b: it plays one example's segments in order in
    consecutive batches, then the next example's, so a trainer carries its state per
    lane and resets lane b where sequence == 0. Read the output with
    batchtool.load(DST). With --world-size N, each of N training ranks gets its own B
    lanes and the same number of batches.
    """
    example = ("batchtool segment sample_data/parquet /tmp/seg --key key --sequence tokens,frames "
               "--context label --num-unroll 20 --batch-size 32")
    options = SegmentOptions
    kind = Kind.BATCHES
    spills = True
    batches_flag = True

    def resolved(self, options: SegmentOptions, schema: pa.Schema) -> SegmentOptions:
        return options.with_context(schema)

    def output_schema(self, options: SegmentOptions, schema: pa.Schema) -> pa.Schema:
        return _plan(options, schema).schema

    def recorded(self, options: SegmentOptions, output: OutputOptions) -> dict[str, Any]:
        return {**options.manifest_options(), "memory": options.memory}

    def plan(self, options: SegmentOptions, context: Context, stats: Any) -> SegmentPlan:
        return _plan(options, context.schema)

    @contextmanager
    def regroup(self, plan: SegmentPlan, data: Dataset, report: ReadReport,
                runtime: Runtime) -> Iterator[Regrouped]:
        """The one pass: check every chunk (on the engine), index its keys, plan lanes as chunks arrive (here),
        and hand the planner's items to the writer, whose workers build their batches; the keys are checked
        unique once the last chunk is read, before the writer finishes."""
        o = plan.options
        columns = o.source_columns
        sample = next(iter(data.tasks(columns)), None)
        planner = LanePlanner(plan, check_memory(o, sample().data if sample else None))
        index = key_index(o.memory, o.tmp_dir)

        def checked() -> Iterator[Examples]:
            for examples in runtime.map(functools.partial(prepare_chunk, plan, data.locate),
                                        data.tasks(columns, report)):
                index.add(examples.key_hash, examples.ids)
                yield examples
            check_unique_keys(index, data, o.key, runtime.threads)

        try:
            yield Regrouped(planner.items(checked()), functools.partial(build_batches, plan),
                            lambda: planner.stats.as_dict(plan), sequence_columns=tuple(o.sequence))
        finally:
            index.close()

    def dry_run_columns(self, options: SegmentOptions) -> list[str]:
        return [options.sequence[0]]

    def dry_run_pass(self, options: SegmentOptions, chunk: Chunk) -> DatasetStats:
        return chunk_stats(chunk, None, options.sequence[0])

    def expected(self, plan: SegmentPlan, rows_in: int | None,
                 stats: DatasetStats | None = None) -> tuple[int | None, dict[str, Any]]:
        """Segments, batches and padding efficiency from the first sequence column's length histogram."""
        o = plan.options
        lengths = stats.length_counts if stats is not None else np.zeros(0, np.int64)
        steps = np.arange(len(lengths))
        count = np.maximum(1, -(-steps // o.num_unroll)) if o.pad else steps // o.num_unroll
        segments = int((count * lengths).sum())
        batches = -(-segments // (o.batch_size * o.world_size)) * o.world_size
        slots = batches * o.batch_size * o.num_unroll
        return None, {"segments": segments, "batches": batches,
                      "padding_efficiency": round(int((steps * lengths).sum()) / slots, 6) if slots else None}


OP = SegmentOp()

__all__ = ["DEFAULT_MEMORY", "OP", "FlagPair", "Ranks", "SegmentOp", "SegmentOptions", "check_memory"]
