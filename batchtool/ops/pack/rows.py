"""pack's exchange: every example to the spill group of its output position (its slot among examples of its
length, then its row, through keyed permutations), each group sorted into output order and assembled into packed
rows on the engine's workers. The plan decides everything; these functions only move rows where it says."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.io.dataset import Chunk, ReadReport
from batchtool.io.example_ids import carry
from batchtool.core.errors import InputError, OptionSchemaError, SchemaError
from batchtool.ops.regroup import (Cut, Exchange, Input, Probe, Runtime, Scatter, Scattered, SortedBatches,
                                   SortedStream, firsts_of)
from batchtool.core.tally import Tally
from batchtool.ops.keyed import flush_bytes, spill_row_bytes
from batchtool.ops.pack.options import CU_UNPADDED, SOURCE_OFFSET, PackColumns, feature_lists
from batchtool.ops.pack.plan import (BatchLayout, PackPlan, batch_layout, check_batches, check_long,
                                     planned, spill_layout)
from batchtool.ops.pack.segments import row_offsets, spans_of, spread
from batchtool.ops.rows import sorted_rows, take_sizes
from batchtool.io.padding import pad_list_column, row_lengths, sequence_lengths

ORDER_STAGE, SPILL_STAGE = "pack/order", "pack/spill"
_POS, _ORDER = "__batchtool_pos", "__batchtool_order"


# --- second pass: pieces, slots, positions, spill ---------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """One input chunk as items to pack (examples, or pieces of them), with what was dropped or split."""

    items: Chunk
    lengths: np.ndarray
    rows_in: int
    dropped: int
    split: int


def prepare(chunk: Chunk, plan: PackPlan, locate: Callable[[int], str]) -> Prepared:
    """Measure, check, drop or split one chunk of the columns pack keeps, and normalise its sequence columns to
    plain lists; a pure function run on worker threads."""
    o, cols = plan.options, plan.columns

    def at(i: int) -> str:
        return locate(chunk.ids[i])

    try:
        lengths = sequence_lengths(chunk.data, cols.sequences, at)
    except SchemaError as exc:
        if not cols.defaulted:
            raise
        raise OptionSchemaError("sequence", f"{exc}; pass {{sequence}} to choose the columns to pack") from exc
    check_long(lengths, chunk, cols.length, o, locate)
    rows_in, dropped = chunk.num_rows, 0
    long = lengths > o.max_length
    if o.long == "drop" and long.any():
        chunk, lengths, dropped = chunk.filter(~long), lengths[~long], int(long.sum())
    data = chunk.data
    source = np.arange(len(lengths))
    pieces = lengths
    offsets = np.zeros(len(lengths), dtype=np.int64)
    if o.long == "split":
        count = np.maximum(1, -(-lengths // o.max_length))
        source = np.repeat(source, count)
        offsets = (np.arange(len(source)) - np.repeat(np.cumsum(count) - count, count)) * o.max_length
        pieces = np.minimum(lengths[source] - offsets, o.max_length)
        if len(source) != len(lengths):  # each piece repeats its example's other columns, never its sequences (a
            # long example's whole sequence once per piece would be its length squared over L)
            data = data.select([n for n in data.schema.names if n not in cols.sequences]).take(pa.array(source))
    bounds = pa.array(np.concatenate([[0], np.cumsum(pieces)]).astype(np.int32))
    arrays = [pa.ListArray.from_arrays(bounds, chunk.data.column(f.name).flatten(), type=pa.list_(f.type.value_field))
              if f.name in cols.sequences else data.column(f.name) for f in chunk.data.schema]
    names = list(chunk.data.schema.names)
    if o.long == "split":
        arrays.append(pa.array(offsets.astype(np.int32)))
        names.append(cols.names[SOURCE_OFFSET])
    items = Chunk(pa.RecordBatch.from_arrays(arrays, names=names), chunk.ids[source])
    return Prepared(items, pieces.astype(np.int64), rows_in, dropped, int(long.sum()) if o.long == "split" else 0)


def _prepare_numbered(plan: PackPlan, locate: Callable[[int], str], _: int, chunk: Chunk) -> Prepared:
    return prepare(chunk, plan, locate)


class Slots:
    """Gives each item, in input order, its row: the n-th item of length s takes slot perm_t(first[s] + n) of the
    slots of its span t (a keyed permutation per span, ops/pack/segments.py; t = s without --segment-multiple), and
    that slot's row comes from the plan."""

    def __init__(self, plan: PackPlan) -> None:
        self.plan = plan
        self.seen = np.zeros(len(plan.counts), dtype=np.int64)

    def rows(self, lengths: np.ndarray, locate: Callable[[int], str], ids: np.ndarray) -> np.ndarray:
        order = np.argsort(lengths, kind="stable")
        ordered = lengths[order]
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        within = np.arange(len(ordered)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(ordered)]])))
        rank = np.empty(len(lengths), dtype=np.int64)
        rank[order] = self.seen[ordered] + within
        self.seen += np.bincount(lengths, minlength=len(self.seen))
        over = np.flatnonzero(rank >= self.plan.counts[lengths])
        if len(over):
            raise InputError(f"{locate(ids[over[0]])}: the input changed while it was read (more examples of "
                             f"{lengths[over[0]]} steps than the first pass counted)")
        return self.plan.packing.rows_of(*self.plan.spans.slots(lengths, rank, self.plan.seed))


def spill_schema(schema: pa.Schema, plan: PackPlan) -> pa.Schema:
    """What is spilled per item: the input columns (sequences as plain lists), the piece's offset with
    --split-long, its output position and its order within the row."""
    kept = plan.columns.kept(schema)
    fields = [pa.field(f.name, pa.list_(f.type.value_field)) if f.name in plan.columns.sequences else f
              for f in schema if f.name in kept]
    if plan.options.long == "split":
        fields.append(pa.field(plan.columns.names[SOURCE_OFFSET], pa.int32()))
    fields += [pa.field(_POS, pa.int64()), pa.field(_ORDER, pa.uint64())]
    return pa.schema(fields)


def placed(plan: PackPlan, input: Input, rows_per_group: int, runtime: Runtime,
           report: ReadReport) -> Iterator[tuple[Chunk, np.ndarray, Tally]]:
    """The second pass (Exchange.rows): every chunk prepared on the runtime's workers, then, in input order (so
    the ranks, and everything after them, are the same for any --threads), each item given its output position
    and its order within the row; with the spill group of its position and what the chunk read, dropped, split
    and spilled. Items of a row of the --world-size remainder (position -1) are dropped and counted."""
    slots = Slots(plan)
    columns = plan.columns.kept(input.schema)
    for p in runtime.map_rows(functools.partial(_prepare_numbered, plan, input.locate), columns, report):
        tally = Tally.of(rows_in=p.rows_in, dropped=p.dropped, split=p.split, items=len(p.lengths))
        if not len(p.lengths):
            yield Chunk.concat([], spill_schema(input.schema, plan)), np.zeros(0, np.int64), tally
            continue
        position = plan.positions(slots.rows(p.lengths, input.locate, p.items.ids))
        items = p.items
        if plan.ranks is not None:
            kept = position >= 0
            tally.add(remainder=int((~kept).sum()), items=-int((~kept).sum()))
            items, position = items.filter(kept), position[kept]
        order = rng.keyed_hash(plan.seed, ORDER_STAGE, items.ids)
        batch = items.data.append_column(_POS, pa.array(position)).append_column(_ORDER, pa.array(order))
        yield Chunk(batch, items.ids), position // rows_per_group, tally


def in_row_order(rows: pa.RecordBatch) -> np.ndarray:
    """A sorted spill group's items in output order: by position, then by their keyed order within the row."""
    return np.lexsort((rows.column(_ORDER).to_numpy(), rows.column(_POS).to_numpy()))


# --- assembling packed rows (pure, on the engine's workers) ------------------------------------------------

@dataclass(frozen=True)
class BatchItem:
    """One batch on its way to a worker: its index, its items in row order, its padded length."""

    index: int
    items: Chunk
    pad_length: int


def assemble(items: pa.RecordBatch, rows: np.ndarray, batch: int, pad_length: int, schema: pa.Schema,
             sequences: Sequence[str], pad_values: Mapping[str, Any], names: Mapping[str, str], multiple: int = 1,
             max_segments: int | None = None) -> pa.RecordBatch:
    """Packed rows of `schema` from items in row order (`rows`: each item's row, non-decreasing): the
    sequence columns concatenated and padded to `pad_length`, segment_ids and positions per step,
    cu_seqlens, num_examples and length per row (each own column under its name in `names`), every other
    column as a list per row. `multiple` M: each item spans a multiple of M steps, padded at its end, its segment id
    and positions running on over its padding (cu_seqlens the spans' offsets, cu_seqlens_unpadded the real lengths'
    sums). `max_segments` K: cu_seqlens of K + 1 offsets a row, the last repeated."""
    lengths = row_lengths(items.column(sequences[0]))
    span = spans_of(lengths, multiple)
    n = len(lengths)
    starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if n else np.zeros(0, np.int64)
    count = len(starts)
    per_row = np.diff(np.concatenate([starts, [n]]))
    row = np.repeat(np.arange(count), per_row)
    within = np.arange(n) - starts[row]

    def in_row(steps: np.ndarray) -> np.ndarray:
        """Where each item's `steps` start in its row."""
        first = np.cumsum(steps) - steps
        return first - first[starts][row]

    offset = in_row(span)
    row_steps = np.add.reduceat(span, starts) if n else np.zeros(0, np.int64)
    step_item = np.repeat(np.arange(n), span)
    step = np.arange(len(step_item)) - (np.cumsum(span) - span)[step_item]
    dest = row[step_item] * pad_length + offset[step_item] + step
    padded = pa.array((np.arange(count + 1) * pad_length).astype(np.int32))
    step_type = schema.field(names["segment_ids"]).type.value_type  # options.step_type: what holds L

    def per_step(values: np.ndarray) -> pa.Array:
        out = np.zeros(count * pad_length, dtype=step_type.to_pandas_dtype())
        out[dest] = values
        return pa.ListArray.from_arrays(padded, pa.array(out))

    computed = {names[role]: make for role, make in {
        "segment_ids": lambda: per_step((within + 1)[step_item]),
        "positions": lambda: per_step(step),
        "cu_seqlens": lambda: row_offsets(offset + span, row, within, count, max_segments),
        CU_UNPADDED: lambda: row_offsets(in_row(lengths) + lengths, row, within, count, max_segments),
        "num_examples": lambda: pa.array(per_row.astype(np.int32)),
        "length": lambda: pa.array((np.add.reduceat(lengths, starts) if n else row_steps).astype(np.int32)),
        "batch": lambda: pa.array(np.full(count, batch, dtype=np.int64)),
    }.items()}
    example_bounds = pa.array(np.concatenate([starts, [n]]).astype(np.int32))
    row_bounds = pa.array(np.concatenate([[0], np.cumsum(row_steps)]).astype(np.int32))
    arrays = []
    for f in schema:
        if f.name in sequences:
            column = items.column(f.name)
            steps = column.flatten() if multiple == 1 else spread(column, lengths, multiple, pad_values[f.name])
            packed = pa.ListArray.from_arrays(row_bounds, steps, type=f.type)
            arrays.append(pad_list_column(packed, pad_length, pad_values[f.name]))
        elif f.name in computed:
            arrays.append(computed[f.name]())
        else:
            arrays.append(pa.ListArray.from_arrays(example_bounds, items.column(f.name), type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def consumed(items: Chunk, plan: PackPlan) -> int:
    """Input examples a batch finishes: every item, or with --split-long only first pieces."""
    if plan.options.long != "split":
        return items.num_rows
    return int((items.data.column(plan.columns.names[SOURCE_OFFSET]).to_numpy() == 0).sum())


def build(plan: PackPlan, item: BatchItem) -> tuple[list[pa.RecordBatch], int]:
    """One batch's packed rows, carrying each row's documents' example ids (batchtool.io.example_ids: one per item,
    a split document's pieces each its own), and the input examples it completes (the writer's work, on a
    worker)."""
    data = item.items.data
    rows = data.column(_POS).to_numpy()
    packed = assemble(data, rows, item.index, item.pad_length, plan.schema, plan.columns.sequences, plan.pad_values,
                      plan.columns.names, plan.options.multiple, plan.options.max_segments)
    firsts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if len(rows) else np.zeros(0, np.int64)
    return [carry(packed, item.items.ids, np.append(firsts, len(rows)))], consumed(item.items, plan)


# --- the whole regrouping ----------------------------------------------------------------------------------

def pack_stats(plan: PackPlan, layout: BatchLayout, tally: Tally) -> dict[str, Any]:
    """manifest["stats"]: what was read, dropped and split, then the packing and its efficiency."""
    dropped = {"long": tally.count("dropped"), **({"remainder": tally.count("remainder")} if plan.ranks else {})}
    out: dict[str, Any] = {"rows_in": tally.count("rows_in"), "lengths_in": plan.lengths.summary(),
                           "examples_dropped": dropped,
                           "examples_split": tally.count("split"), "examples_packed": tally.count("items")}
    return {**out, **planned(plan, layout)}


def exchange(plan: PackPlan, input: Input, probe: Probe) -> Exchange:
    """pack's exchange: items placed in input order on the driver (Exchange.rows: their slots depend on the items
    before), scattered to the spill group of their output position (groups sized on the first chunk's bytes, as is
    the largest batch, checked against --memory first), each group sorted into output order on a worker, and the
    planned batches assembled where they are written."""
    measured = probe(functools.partial(_row_bytes, plan.columns))
    sizes = measured if measured is not None else spill_row_bytes(None, plan.columns)  # type: ignore[arg-type]
    groups = spill_layout(plan, sizes)
    layout = batch_layout(plan)
    check_batches(plan, layout, sizes)
    scatter = Scatter(spill_schema(input.schema, plan), groups.parts, plan.seed, SPILL_STAGE,
                      flush_bytes(plan.memory, groups.groups, plan.tasks), order=in_row_order)
    return Exchange(scatter, functools.partial(_cut, plan, layout),
                    functools.partial(placed, plan, input, groups.rows_per_group))


def _row_bytes(columns: PackColumns, chunk: Chunk) -> tuple[float, float]:
    return spill_row_bytes(chunk.data.select(columns.kept(chunk.data.schema)), columns)  # type: ignore[arg-type]


def _cut(plan: PackPlan, layout: BatchLayout, scattered: Scattered, runtime: Runtime) -> Cut:
    """The planned batches over the sorted groups; the statistics of what the placing read, dropped and split."""
    tally = Tally()
    for chunk_tally in scattered.stats:
        tally.merge(chunk_tally)
    batches = PackBatches(plan, scattered.schema, scattered.groups, layout.examples,
                          firsts_of(layout.examples), firsts_of(layout.rows), layout.widest)
    return Cut(batches, lambda: pack_stats(plan, layout, tally), feature_lists(plan.schema, plan.columns))


@dataclass(frozen=True)
class PackBatches(SortedBatches):
    """pack's output batches (ops.regroup.SortedBatches): batch k packs items [first_item[k], first_item[k + 1]) of the
    sorted groups into layout rows."""

    plan: PackPlan
    schema: pa.Schema
    streams: list[SortedStream]
    items: np.ndarray
    first_item: np.ndarray
    firsts: np.ndarray
    widest: np.ndarray

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.streams)

    def reader(self, start: int, end: int) -> _PackReader:
        pads = tuple(self.plan.pad_length(int(w)) for w in self.widest[start:end])
        return _PackReader(self.plan, self.schema, self.streams, int(self.first_item[start]),
                           tuple(int(n) for n in self.items[start:end]), start, pads)


@dataclass(frozen=True)
class _PackReader:
    """A run of pack's batches assembled on a worker from the sorted groups (SortedBatches.reader)."""

    plan: PackPlan
    schema: pa.Schema
    streams: list[SortedStream]
    first_item: int
    items: tuple[int, ...]
    first_batch: int
    pads: tuple[int, ...]

    def __call__(self) -> Iterator[pa.RecordBatch]:
        chunks = take_sizes(sorted_rows(self.streams, self.first_item), self.items, self.schema)
        for k, (chunk, pad) in enumerate(zip(chunks, self.pads)):
            yield build(self.plan, BatchItem(self.first_batch + k, chunk, pad))[0][0]


__all__ = ["BatchItem", "PackBatches", "Prepared", "Slots", "assemble", "build", "consumed", "exchange", "in_row_order",
           "pack_stats", "placed", "prepare", "spill_schema"]
