"""The `shuffle` op's run: its Operation (its declaration, DECLARED, is the package's), the global shuffle's
exchange and the buffered shuffle."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import budget, rng
from batchtool.io.dataset import Chunk, ReadReport
from batchtool.io.spill import parts_for
from batchtool.ops.base import Context, Operation, Said
from batchtool.ops.keyed import flush_bytes, range_bytes
from batchtool.ops.regroup import Cut, Exchange, Input, Probe, Regrouped, Runtime, Scatter, Scattered, Stream
from batchtool.ops.rows import FixedBatches, Yardstick, bytes_per_row, emit, emit_batch, estimate_bytes, peek, rebatch
from batchtool.ops.shuffle import DECLARED, ShuffleOptions

STAGE = "shuffle"
MAX_BATCH_ROWS = 65536
BATCH_BYTES = 1 << 19
"""Output row groups when --batch-size is not given: at most MAX_BATCH_ROWS rows and about BATCH_BYTES of
Arrow data. Fixed, not a share of --memory, since the row groups are part of the output, which the budget
never changes; small enough that the batches queued for writing stay well under any useful budget."""
BUFFER_COPIES, SLOT_BYTES = 5, 100
"""The buffered shuffle holds its buffer about BUFFER_COPIES times while gathering (the buffer, the pushed rows,
their concatenation and the new buffer) plus SLOT_BYTES of row numbers per slot."""


# -- sizes: output batches and the budget, from the first chunk -----------------------------------------------


def default_batch_rows(row_bytes: float) -> int:
    return int(max(1, min(MAX_BATCH_ROWS, BATCH_BYTES / max(row_bytes, 1.0))))


def output_batch_rows(first: Chunk | Yardstick | None, options: ShuffleOptions) -> int:
    """Rows per output batch: --batch-size, or a default sized from the first input chunk's bytes per row."""
    return options.batch_size or default_batch_rows(bytes_per_row(first))


def check_memory(options: ShuffleOptions, memory: int, first: Chunk | Yardstick | None, rows: int | None) -> None:
    """Stop before shuffling if one --batch-size batch, or the --buffer, would not fit the budget."""
    per_row = bytes_per_row(first)
    if options.batch_size is not None:
        budget.check_rows("batch_size", options.batch_size, rows, per_row, memory)
    if options.buffered:
        field, value = ("buffer", options.buffer) if options.buffer is not None else \
            ("min_after_dequeue", options.min_after_dequeue)
        held = options.capacity if rows is None else min(options.capacity, rows)
        budget.check_fits(field, f"a buffer of {held:,} rows", held * (BUFFER_COPIES * per_row + SLOT_BYTES),
                          memory, f"give a smaller {{{field}}} or a larger {{memory}}", value=value)


def layout(input: Input, plan: ShufflePlan, first: Yardstick | None) -> dict[str, Any]:
    """From the first chunk, before any row moves: check the budget and size the output batches; the manifest's
    statistics of the plan (not the global shuffle's key ranges, `key_ranges`: how many depends on --memory and
    --threads, and changes nothing of the output)."""
    options = plan.options
    estimate = estimate_bytes(input, first)
    check_memory(options, plan.memory, first, input.num_rows if input.num_rows is not None
                 else int(estimate / bytes_per_row(first)))
    info: dict[str, Any] = {"mode": "buffered" if options.buffered else "global",
                            "batch_rows": output_batch_rows(first, options), "estimated_bytes": int(estimate)}
    if options.buffered:
        info["capacity"] = options.capacity
    return info


def key_ranges(plan: ShufflePlan, info: dict[str, Any]) -> int:
    """The global shuffle's key ranges: each sorted by a task of its own, within its share of --memory."""
    return parts_for(info["estimated_bytes"], range_bytes(plan.memory, plan.tasks))


def _exchange_cut(info: dict[str, Any], options: ShuffleOptions, scattered: Scattered, runtime: Runtime) -> Cut:
    """The global shuffle's batches from its one sorted stream, as the local spill's rebatch cuts them."""
    rows = int(scattered.rows.sum())
    size = info["batch_rows"]
    kept = rows - (rows % size if options.drop_remainder else 0)
    return Cut(FixedBatches(scattered.groups[0], scattered.schema, size, kept, options.batch_size is not None),
               functools.partial(shuffle_stats, info, rows, options=options))


def shuffle_stats(info: dict[str, Any], rows_in: int, options: ShuffleOptions) -> dict[str, Any]:
    dropped = rows_in % info["batch_rows"] if options.drop_remainder else 0
    return {**info, "rows_in": rows_in, "examples_dropped": dropped}


# -- the buffered shuffle (shuffle_batch parity) --------------------------------------------------------------


class BufferedShuffle:
    """shuffle_batch's queue, made deterministic.

    Rows enter `capacity` slots in input order. Once the buffer is full, output position t takes
    slot floor(u_t * capacity), u_t keyed by t, and the next input row refills that slot. When the
    input ends, the remaining rows leave the same way from the shrinking buffer (the drawn slot is
    refilled from the last one). Decisions are made on row numbers; the rows themselves are gathered
    once per push, so memory holds the buffer plus one push of new rows.
    """

    def __init__(self, capacity: int, seed: int, schema: pa.Schema) -> None:
        self.capacity, self.seed, self.schema = capacity, seed, schema
        self._held = Chunk.concat([], schema)
        self._held_rows = np.zeros(0, dtype=np.int64)
        self._slots: list[int] = []
        self._next_row = 0
        self._out_pos = 0

    def _uniforms(self, count: int) -> list[float]:
        positions = np.arange(self._out_pos, self._out_pos + count, dtype=np.uint64)
        self._out_pos += count
        return rng.uniform(self.seed, STAGE + "/buffer", positions).tolist()

    def push(self, new: Chunk) -> Chunk:
        """Enqueue rows in order; returns the rows dequeued meanwhile (one per row past a full buffer)."""
        rows = list(range(self._next_row, self._next_row + new.num_rows))
        self._next_row += new.num_rows
        fill = min(self.capacity - len(self._slots), len(rows))
        self._slots.extend(rows[:fill])
        out: list[int] = []
        for u, row in zip(self._uniforms(len(rows) - fill), rows[fill:]):
            slot = int(u * self.capacity)
            out.append(self._slots[slot])
            self._slots[slot] = row
        return self._gather(new, out)

    def drain(self) -> Chunk:
        """The input has ended: dequeue everything left, one uniform draw over the remaining rows each."""
        slots = self._slots
        out: list[int] = []
        for u in self._uniforms(len(slots)):
            slot = int(u * len(slots))
            out.append(slots[slot])
            slots[slot] = slots[-1]
            slots.pop()
        return self._gather(Chunk.concat([], self.schema), out)

    def _gather(self, new: Chunk, out: list[int]) -> Chunk:
        pool = Chunk.concat([self._held, new], self.schema) if new.num_rows else self._held
        pool_rows = np.concatenate([self._held_rows, np.arange(self._next_row - new.num_rows, self._next_row)])
        order = np.argsort(pool_rows, kind="stable")
        sorted_rows = pool_rows[order]

        def positions(rows: list[int]) -> np.ndarray:
            return order[np.searchsorted(sorted_rows, np.asarray(rows, dtype=np.int64))]

        self._held, self._held_rows = pool.take(positions(self._slots)), np.asarray(self._slots, dtype=np.int64)
        return pool.take(positions(out))


def buffered_shuffle(chunks: Iterable[Chunk], capacity: int, seed: int, schema: pa.Schema) -> Iterator[Chunk]:
    """The buffered shuffle of a chunk stream; input is pushed in groups of at least `capacity` rows so
    that gathering (which copies the buffer) costs at most about one extra copy of the data."""
    buffer = BufferedShuffle(capacity, seed, schema)
    group: list[Chunk] = []
    rows = 0
    for chunk in chunks:
        group.append(chunk)
        rows += chunk.num_rows
        if rows >= capacity:
            out = buffer.push(Chunk.concat(group, schema))
            group, rows = [], 0
            if out.num_rows:
                yield out
    for out in (buffer.push(Chunk.concat(group, schema)), buffer.drain()):
        if out.num_rows:
            yield out


# -- the operation ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShufflePlan:
    """What a shuffle needs besides its input: its options and the seed of its keyed order. The rest (batch
    rows, spill parts) is sized from the first chunk when it regroups."""

    options: ShuffleOptions
    seed: int
    memory: int
    """--memory, which sizes its spill's key ranges and bounds a batch or the buffer."""
    tasks: int = 1
    """Key ranges sorted at once (ops.base.Context.tasks): with --memory, what sizes its spill's key ranges."""


class _Buffered:
    """The buffered shuffle's output batches, computed as they stream (from the input again if streamed again):
    the first chunk, read now, sizes them and checks the budget; the rows are counted as they pass."""

    def __init__(self, plan: ShufflePlan, input: Input, runtime: Runtime, report: ReadReport) -> None:
        self.plan, self.schema, self.runtime, self.report = plan, input.schema, runtime, report
        first, self._chunks = peek(runtime.rows(None, report))
        self.info = layout(input, plan, Yardstick.of(first))
        self.rows_in = 0

    def __iter__(self) -> Iterator[Chunk]:
        o, schema = self.plan.options, self.schema
        chunks, self._chunks = self._chunks, None
        if chunks is None:
            chunks = self.runtime.rows(None, self.report)
        self.rows_in = 0
        shuffled = buffered_shuffle(self._counted(chunks), o.capacity, self.plan.seed, schema)
        yield from rebatch(shuffled, self.info["batch_rows"], schema, o.drop_remainder)

    def _counted(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        for chunk in chunks:
            self.rows_in += chunk.num_rows
            yield chunk

    def stats(self) -> dict[str, Any]:
        return shuffle_stats(self.info, self.rows_in, self.plan.options)


@contextmanager
def _buffered(plan: ShufflePlan, input: Input, runtime: Runtime, report: ReadReport) -> Iterator[Regrouped]:
    buffered = _Buffered(plan, input, runtime, report)
    yield Regrouped(buffered, emit if plan.options.batch_size is None else emit_batch, buffered.stats)


class Shuffle(Operation[ShuffleOptions, ShufflePlan], declared=DECLARED):
    """The global shuffle reorders (a pipeline spills it before anything after it runs); the buffered one
    computes its order as it streams; with --batch-size either writes batches (it must come last)."""

    def output_schema(self, options: ShuffleOptions, schema: pa.Schema) -> pa.Schema:
        return schema

    def plan(self, options: ShuffleOptions, context: Context, stats: Any) -> ShufflePlan:
        return ShufflePlan(options, context.seed, context.memory, context.tasks)

    def regroup(self, plan: ShufflePlan, input: Input, probe: Probe) -> Exchange | Stream:
        """The global shuffle as its exchange (its batches cut from the one sorted stream); the buffered one as it
        streams."""
        o = plan.options
        if o.buffered:
            return Stream(functools.partial(_buffered, plan, input))
        info = layout(input, plan, probe(Yardstick.of))
        parts = key_ranges(plan, info)
        scatter = Scatter(input.schema, (parts,), plan.seed, STAGE, flush_bytes(plan.memory, parts, plan.tasks))
        return Exchange(scatter, functools.partial(_exchange_cut, info, o))

    def said(self, stats: dict[str, Any]) -> Said:
        return Said(note=(f"{stats['mode']} shuffle",) if "mode" in stats else ())

    def expected(self, plan: ShufflePlan, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict[str, Any]]:
        o = plan.options
        if rows_in is None or o.batch_size is None:
            return rows_in, {}
        batches = rows_in // o.batch_size if o.drop_remainder else -(-rows_in // o.batch_size)
        return min(rows_in, batches * o.batch_size), {"batches": batches}


OP = Shuffle()

__all__ = ["OP", "STAGE", "BufferedShuffle", "Shuffle", "ShufflePlan", "buffered_shuffle", "check_memory",
           "default_batch_rows", "layout", "output_batch_rows", "shuffle_stats"]
