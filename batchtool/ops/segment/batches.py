"""segment's batch building: a work item of the lane planner as its output batches (cut, padded, keyed), a pure
function of the item, run on the engine's workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.ops.segment.chunks import Examples, SegmentPlan
from batchtool.io.padding import default_pad, list_values, padded_list
from batchtool.io.stats import is_sequence_type

FIRST_INSERTION_INDEX = -(1 << 63)
"""TensorFlow's insertion_index of the first example; each later example (in input order) gets the next value."""
EMPTY_INSERTION_INDEX = (1 << 63) - 1
"""insertion_index of an empty padding row: never a real example's."""


@dataclass(frozen=True)
class SegmentItem:
    """A run of consecutive batches: slot [t, b] (batch first_batch + t, lane b) plays segment seg[t, b] of
    row row[t, b] of sources[src[t, b]]; src -1 is an empty slot."""

    first_batch: int
    sources: tuple[Examples, ...]
    src: np.ndarray
    row: np.ndarray
    seg: np.ndarray
    finished: int
    """Examples whose last segment is in this item (progress and rows_in)."""


def build_batches(plan: SegmentPlan, item: SegmentItem) -> tuple[list[pa.RecordBatch], int]:
    """The item's batches of B rows as one RecordBatch, stacked (Regrouped.stacked_rows), or under
    allow_small_batch one RecordBatch each, without empty rows; and the examples it finishes (the writer's work:
    Regrouped.work).

    With world_size N each step of the planner's N * B lanes is cut into N batches, rank by rank."""
    o = plan.options
    U = o.num_unroll
    N = o.world_size
    item = replace(item, sources=tuple(source.loaded() for source in item.sources))
    n, lanes = item.src.shape
    B = lanes // N
    empty = (item.src < 0).ravel()
    # an empty slot reads its batch's first real row, so context and state keep their shape (then zeroed)
    first = np.argmax(item.src >= 0, axis=1)
    src = np.where(item.src >= 0, item.src, item.src[np.arange(n), first][:, None]).ravel()
    row = np.where(item.src >= 0, item.row, item.row[np.arange(n), first][:, None]).ravel()
    seg = np.where(empty, 0, item.seg.ravel()).astype(np.int64)
    base = np.cumsum([0] + [s.num_rows for s in item.sources])
    g = base[src] + row

    def per_example(values: Callable[[Examples], np.ndarray]) -> np.ndarray:
        return np.concatenate([values(s) for s in item.sources])[g]

    def column(name: str) -> pa.Array:
        return pa.chunked_array([s.data.column(name) for s in item.sources]).take(pa.array(g)).combine_chunks()

    count = np.where(empty, 0, per_example(lambda s: s.count))
    total = np.where(empty, 0, per_example(lambda s: s.total_length))
    value = np.where(empty, 0, per_example(lambda s: s.value_length))
    ordinal = per_example(lambda s: s.ordinals)
    steps = np.clip(value - seg * U, 0, U)
    original = pa.chunked_array([s.keys for s in item.sources], type=pa.string()).take(pa.array(g))
    keys, next_keys = _keys(original.combine_chunks(), seg, count, empty)
    own = o.names
    arrays: dict[str, pa.Array] = {own[role]: values for role, values in {
        "key": keys, "next_key": next_keys,
        "sequence": pa.array(seg.astype(np.int32)),
        "sequence_count": pa.array(count.astype(np.int32)),
        "length": pa.array(np.clip(total - seg * U, 0, U).astype(np.int32)),
        "total_length": pa.array(total.astype(np.int32)),
        "insertion_index": pa.array(np.where(empty, EMPTY_INSERTION_INDEX, FIRST_INSERTION_INDEX + ordinal)),
        "lane": pa.array(np.tile(np.arange(B, dtype=np.int32), n * N)),
        "batch": pa.array(np.repeat(np.arange(item.first_batch * N, (item.first_batch + n) * N, dtype=np.int64), B)),
    }.items()}
    keep = pa.array(~empty)
    for name in o.context:
        arrays[name] = _zero_where(column(name), keep)
    for name in o.sequence:
        arrays[name] = _segments(item, name, src, row, seg, steps, plan)
    first_segment = pa.array(~empty & (seg == 0))
    for name, col in o.states.items():
        arrays[name] = _zero_where(column(col), first_segment)
    table = pa.RecordBatch.from_arrays([arrays[f.name] for f in plan.schema], schema=plan.schema)
    if not o.allow_small_batch:
        return [table], item.finished  # the item's n * N batches of B rows, stacked (Regrouped.stacked_rows)
    # a batch with no real row keeps its empty rows, so every rank still gets a batch at this step
    real = ~empty.reshape(n * N, B)
    batches = [b if real[t].all() or not real[t].any() else b.filter(pa.array(real[t]))
               for t, b in enumerate(compact_batches(table, B))]
    return batches, item.finished


def compact_batches(table: pa.RecordBatch, rows: int) -> list[pa.RecordBatch]:
    """`table` cut into batches of `rows` rows whose columns are compact (each buffer starts at the batch's first
    value and holds its values only), as the Arrow IPC writer sends them: views of the table's buffers, with each
    batch's offsets rebased in one NumPy pass a column, so the encoder neither copies nor re-checks them column by
    column. A column this cannot view (nulls, booleans, other types) is a slice, which the encoder copies compact."""
    n = -(-table.num_rows // rows)
    starts = np.arange(n, dtype=np.int64) * rows
    lengths = np.minimum(rows, table.num_rows - starts)
    sliced = list(zip(starts.tolist(), lengths.tolist()))
    columns = [_views(column, starts, lengths) or [column.slice(s, r) for s, r in sliced] for column in table.columns]
    return [pa.RecordBatch.from_arrays([c[t] for c in columns], schema=table.schema) for t in range(n)]


def _views(array: pa.Array, starts: np.ndarray, lengths: np.ndarray) -> list[pa.Array] | None:
    """Rows [start, start + length) of `array` for each start, as compact arrays over its buffers
    (compact_batches); None where the array has nulls or an offset, or its type is not a fixed-width number, a
    string or binary, a list or a fixed-size list of those."""
    t = array.type
    if array.null_count or array.offset:
        return None
    counts = lengths.tolist()
    buffers = array.buffers()
    if pa.types.is_boolean(t) or pa.types.is_null(t):
        return None
    if pa.types.is_primitive(t):
        width = t.bit_width // 8
        data = buffers[1]
        return [pa.Array.from_buffers(t, r, [None, data.slice(s * width, r * width)])
                for s, r in zip(starts.tolist(), counts)]
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = _views(array.values, starts * size, lengths * size)
        return None if values is None else [pa.FixedSizeListArray.from_arrays(v, type=t) for v in values]
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t)
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_list(t) or wide):
        return None
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[: len(array) + 1]
    begin = offsets[starts]
    size = offsets[starts + lengths] - begin
    rebased = [pa.py_buffer(offsets[s: s + r + 1] - b) for s, r, b in zip(starts.tolist(), counts, begin.tolist())]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = _views(array.values, begin, size)
        if values is None:
            return None
        return [pa.Array.from_buffers(t, r, [None, o], children=[v]) for r, o, v in zip(counts, rebased, values)]
    data = buffers[2] if buffers[2] is not None else pa.py_buffer(b"")
    return [pa.Array.from_buffers(t, r, [None, o, data.slice(b, z)])
            for r, o, b, z in zip(counts, rebased, begin.tolist(), size.tolist())]


def _segments(item: SegmentItem, name: str, src: np.ndarray, row: np.ndarray, seg: np.ndarray,
              steps: np.ndarray, plan: SegmentPlan) -> pa.Array:
    """Each slot's `steps` real values of its segment, padded to num_unroll steps."""
    U = plan.options.num_unroll
    flats, starts = zip(*(list_values(source.data.column(name)) for source in item.sources))
    begin = np.concatenate([offsets[:-1] for offsets in starts])[
        np.cumsum([0] + [s.num_rows for s in item.sources])[src] + row] + seg * U
    return padded_list(flats, src, begin, steps, U, plan.pad_values[name], plan.schema.field(name).type.value_field)


def _keys(original: pa.Array, seg: np.ndarray, count: np.ndarray, empty: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """key = '%05d_of_%05d:%s' % (sequence, sequence_count, key); next_key = the next one, or 'STOP:%s' % key."""
    def number(values: np.ndarray) -> pa.Array:
        return pc.utf8_lpad(pc.cast(pa.array(values.astype(np.int64)), pa.string()), 5, "0")

    of_count = number(count)
    key = pc.binary_join_element_wise(number(seg), "_of_", of_count, ":", original, "")
    following = pc.binary_join_element_wise(number(seg + 1), "_of_", of_count, ":", original, "")
    stop = pc.binary_join_element_wise("STOP:", original, "")
    next_key = pc.if_else(pa.array(seg + 1 >= count), stop, following)
    real = pa.array(~empty)
    return pc.if_else(real, key, ""), pc.if_else(real, next_key, "")


def _zero_where(arr: pa.Array, keep: pa.Array) -> pa.Array:
    """arr where keep, else a zero of the same shape (0, False, '' or a list of those of the same length)."""
    return pc.if_else(keep, arr, _zeros_like(arr))


def _zeros_like(arr: pa.Array) -> pa.Array:
    t = arr.type
    if is_sequence_type(t):
        values, offsets = list_values(arr)
        zeros = _zeros_like(values)
        if pa.types.is_fixed_size_list(t):
            return pa.FixedSizeListArray.from_arrays(zeros, type=t)
        if pa.types.is_large_list(t):
            return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), zeros, type=t)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), zeros, type=t)
    try:
        return pc.fill_null(pa.nulls(len(arr), t), pa.scalar(default_pad(t), t))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        return pa.nulls(len(arr), t)  # types with no zero (structs, ...) stay null


__all__ = ["EMPTY_INSERTION_INDEX", "FIRST_INSERTION_INDEX", "SegmentItem", "build_batches"]
