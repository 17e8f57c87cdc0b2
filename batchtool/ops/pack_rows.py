"""pack's regrouping: every example to the spill group of its output position (its slot among examples of its
length, then its row, through keyed permutations), read back in output order and assembled into packed rows
on the engine's workers. The plan decides everything; these functions only move rows where it says."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import rng
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import InputError, OptionSchemaError, SchemaError
from batchtool.ops.base import Regrouped, Runtime, Tally
from batchtool.ops.bucket_batches import take_sizes
from batchtool.ops.bucket_plan import flush_bytes, row_bytes
from batchtool.ops.pack_options import SOURCE_OFFSET, feature_lists
from batchtool.ops.pack_plan import (ROW_STAGE, BatchLayout, PackPlan, SpillLayout, batch_layout, check_batches,
                                     check_long, planned, spill_layout)
from batchtool.padding import pad_list_column, row_lengths, sequence_lengths
from batchtool.spill import Spill

SLOT_STAGE, ORDER_STAGE, SPILL_STAGE = "pack/slot", "pack/order", "pack/spill"
_POS, _ORDER = "__batchtool_pos", "__batchtool_order"
_TAKE = 4096
"""Examples taken at a time from a sorted spill group (so the group is never copied whole)."""


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
    """Measure, check, drop or split one chunk, and normalise its sequence columns to plain lists;
    a pure function run on worker threads."""
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
    if cols.dropped:
        chunk = Chunk(chunk.data.drop_columns(list(cols.dropped)), chunk.ids)
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
        data = data.take(pa.array(source)) if len(source) != len(lengths) else data
    bounds = pa.array(np.concatenate([[0], np.cumsum(pieces)]).astype(np.int32))
    arrays = [pa.ListArray.from_arrays(bounds, chunk.data.column(f.name).flatten(), type=pa.list_(f.type.value_field))
              if f.name in cols.sequences else data.column(f.name) for f in chunk.data.schema]
    names = list(chunk.data.schema.names)
    if o.long == "split":
        arrays.append(pa.array(offsets.astype(np.int32)))
        names.append(cols.names[SOURCE_OFFSET])
    items = Chunk(pa.RecordBatch.from_arrays(arrays, names=names), chunk.ids[source])
    return Prepared(items, pieces.astype(np.int64), rows_in, dropped, int(long.sum()) if o.long == "split" else 0)


def _prepare_task(plan: PackPlan, locate: Callable[[int], str], task: Callable[[], Chunk]) -> Prepared:
    return prepare(task(), plan, locate)


class Slots:
    """Gives each item, in input order, its row: the n-th item of length s takes slot perm_s(n) of the
    slots of length s (a keyed permutation per length), and that slot's row comes from the plan."""

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
        total = self.plan.counts[lengths]
        over = np.flatnonzero(rank >= total)
        if len(over):
            raise InputError(f"{locate(ids[over[0]])}: the input changed while it was read (more examples of "
                             f"{lengths[over[0]]} steps than the first pass counted)")
        slots = rng.index_shuffle(self.plan.seed, SLOT_STAGE, rank.astype(np.uint64), total, tweak=lengths)
        return self.plan.packing.rows_of(lengths, slots.astype(np.int64))


def spill_schema(schema: pa.Schema, plan: PackPlan) -> pa.Schema:
    """What is spilled per item: the input columns (sequences as plain lists), the piece's offset with
    --split-long, its output position and its order within the row."""
    fields = [pa.field(f.name, pa.list_(f.type.value_field)) if f.name in plan.columns.sequences else f
              for f in schema if f.name not in plan.columns.dropped]
    if plan.options.long == "split":
        fields.append(pa.field(plan.columns.names[SOURCE_OFFSET], pa.int32()))
    fields += [pa.field(_POS, pa.int64()), pa.field(_ORDER, pa.uint64())]
    return pa.schema(fields)


def scatter(data: Dataset, plan: PackPlan, groups: SpillLayout, spill: Spill, runtime: Runtime,
            report: ReadReport) -> Tally:
    """The second pass: every item to the spill group of its output position, in input order (so the
    ranks, and everything after them, are the same for any --threads). Returns what it read, dropped,
    split and spilled (rows_in, dropped, split, items)."""
    slots = Slots(plan)
    tally = Tally.of(rows_in=0, dropped=0, split=0, items=0)
    with runtime.bar("scatter", data.num_rows) as bar:
        for p in runtime.map(functools.partial(_prepare_task, plan, data.locate), data.tasks(None, report)):
            tally.add(rows_in=p.rows_in, dropped=p.dropped, split=p.split, items=len(p.lengths))
            bar.update(p.rows_in)
            if not len(p.lengths):
                continue
            row_ids = slots.rows(p.lengths, data.locate, p.items.ids)
            position = rng.index_shuffle(plan.seed, ROW_STAGE, row_ids.astype(np.uint64), plan.rows).astype(np.int64)
            order = rng.keyed_hash(plan.seed, ORDER_STAGE, p.items.ids)
            batch = p.items.data.append_column(_POS, pa.array(position)).append_column(_ORDER, pa.array(order))
            spill.add(Chunk(batch, p.items.ids), position // groups.rows_per_group)
    spill.finish()
    return tally


def sorted_items(spill: Spill, groups: SpillLayout) -> Iterator[Chunk]:
    """All items in output order: group by group, sorted by (position, keyed order within the row),
    taken a slice at a time so a group is never copied whole."""
    for group in range(groups.groups):
        for chunk in spill.read_group(group):
            order = np.lexsort((chunk.data.column(_ORDER).to_numpy(), chunk.data.column(_POS).to_numpy()))
            for start in range(0, len(order), _TAKE):
                yield chunk.take(order[start:start + _TAKE])
            del chunk  # before the next group is read


# --- assembling packed rows (pure, on the engine's workers) ------------------------------------------------

@dataclass(frozen=True)
class BatchItem:
    """One batch on its way to a worker: its index, its items in row order, its padded length."""

    index: int
    items: Chunk
    pad_length: int


def assemble(items: pa.RecordBatch, rows: np.ndarray, batch: int, pad_length: int, schema: pa.Schema,
             sequences: Sequence[str], pad_values: Mapping[str, Any], names: Mapping[str, str]) -> pa.RecordBatch:
    """Packed rows of `schema` from items in row order (`rows`: each item's row, non-decreasing): the
    sequence columns concatenated and padded to `pad_length`, segment_ids and positions per step,
    cu_seqlens, num_examples and length per row (each own column under its name in `names`), every other
    column as a list per row."""
    lengths = row_lengths(items.column(sequences[0]))
    n = len(lengths)
    starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if n else np.zeros(0, np.int64)
    count = len(starts)
    per_row = np.diff(np.concatenate([starts, [n]]))
    row = np.repeat(np.arange(count), per_row)
    first_step = np.cumsum(lengths) - lengths
    offset = first_step - first_step[starts][row]
    row_steps = np.add.reduceat(lengths, starts) if n else np.zeros(0, np.int64)
    step_item = np.repeat(np.arange(n), lengths)
    step = np.arange(len(step_item)) - first_step[step_item]
    dest = row[step_item] * pad_length + offset[step_item] + step
    padded = pa.array((np.arange(count + 1) * pad_length).astype(np.int32))

    def per_step(values: np.ndarray) -> pa.Array:
        out = np.zeros(count * pad_length, dtype=np.int32)
        out[dest] = values
        return pa.ListArray.from_arrays(padded, pa.array(out))

    cu = np.zeros(n + count, dtype=np.int32)
    cu[np.arange(n) + row + 1] = offset + lengths
    computed = {names[role]: make for role, make in {
        "segment_ids": lambda: per_step((np.arange(n) - starts[row] + 1)[step_item]),
        "positions": lambda: per_step(step),
        "cu_seqlens": lambda: pa.ListArray.from_arrays(
            pa.array(np.concatenate([starts + np.arange(count), [n + count]]).astype(np.int32)), pa.array(cu)),
        "num_examples": lambda: pa.array(per_row.astype(np.int32)),
        "length": lambda: pa.array(row_steps.astype(np.int32)),
        "batch": lambda: pa.array(np.full(count, batch, dtype=np.int64)),
    }.items()}
    example_bounds = pa.array(np.concatenate([starts, [n]]).astype(np.int32))
    row_bounds = pa.array(np.concatenate([[0], np.cumsum(row_steps)]).astype(np.int32))
    arrays = []
    for f in schema:
        if f.name in sequences:
            packed = pa.ListArray.from_arrays(row_bounds, items.column(f.name).flatten(), type=f.type)
            arrays.append(pad_list_column(packed, pad_length, pad_values[f.name]))
        elif f.name in computed:
            arrays.append(computed[f.name]())
        else:
            arrays.append(pa.ListArray.from_arrays(example_bounds, items.column(f.name), type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def batches(spill: Spill, plan: PackPlan, groups: SpillLayout, layout: BatchLayout,
            schema: pa.Schema) -> Iterator[BatchItem]:
    """The spilled items cut into the planned batches, in output order."""
    items = take_sizes(sorted_items(spill, groups), layout.examples.tolist(), schema)
    for index, chunk in enumerate(items):
        yield BatchItem(index, chunk, plan.pad_length(int(layout.widest[index])))


def consumed(items: Chunk, plan: PackPlan) -> int:
    """Input examples a batch finishes: every item, or with --split-long only first pieces."""
    if plan.options.long != "split":
        return items.num_rows
    return int((items.data.column(plan.columns.names[SOURCE_OFFSET]).to_numpy() == 0).sum())


def build(plan: PackPlan, item: BatchItem) -> tuple[list[pa.RecordBatch], int]:
    """One batch's packed rows, and the input examples it completes (the writer's work, on a worker)."""
    data = item.items.data
    return ([assemble(data, data.column(_POS).to_numpy(), item.index, item.pad_length, plan.schema,
                      plan.columns.sequences, plan.pad_values, plan.columns.names)], consumed(item.items, plan))


# --- the whole regrouping ----------------------------------------------------------------------------------

def pack_stats(plan: PackPlan, layout: BatchLayout, tally: Tally) -> dict[str, Any]:
    """manifest["stats"]: what was read, dropped and split, then the packing and its efficiency."""
    out: dict[str, Any] = {"rows_in": tally.count("rows_in"), "lengths_in": plan.lengths.summary(),
                           "examples_dropped": {"long": tally.count("dropped")},
                           "examples_split": tally.count("split"), "examples_packed": tally.count("items")}
    return {**out, **planned(plan, layout)}


@contextmanager
def regrouped(plan: PackPlan, data: Dataset, report: ReadReport, runtime: Runtime) -> Iterator[Regrouped]:
    """Scatter `data` to the spill (sized on its first chunk's bytes, as is the largest batch, checked against
    --memory first), then give the planned batches back in output order; the spill lives until the context closes."""
    sample = next(iter(data.tasks()), None)
    sizes = row_bytes(sample().data if sample else None, plan.columns)  # type: ignore[arg-type]
    groups = spill_layout(plan, sizes)
    layout = batch_layout(plan)
    check_batches(plan, layout, sizes)
    schema = spill_schema(data.schema, plan)
    o, lengths = plan.options, plan.lengths
    with Spill(schema, groups.parts, plan.seed, SPILL_STAGE, o.tmp_dir,
               flush_bytes(groups, o.memory)) as spill:  # type: ignore[arg-type]
        tally = scatter(data, plan, groups, spill, runtime, report)
        yield Regrouped(items=batches(spill, plan, groups, layout, schema), work=functools.partial(build, plan),
                        stats=lambda: pack_stats(plan, layout, tally),
                        total_rows=lengths.examples - (lengths.long if o.long == "drop" else 0),
                        sequence_columns=feature_lists(plan.schema, plan.columns))


__all__ = ["BatchItem", "Prepared", "Slots", "assemble", "batches", "build", "consumed", "pack_stats", "prepare",
           "regrouped", "scatter", "sorted_items", "spill_schema"]
