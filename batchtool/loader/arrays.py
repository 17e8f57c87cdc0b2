"""Record batches as NumPy arrays shaped [batch, time, ...]: zero-copy where Arrow's buffers allow."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core.errors import InputError, first_line
from batchtool.io.formats.base import Stacked
from batchtool.io.stats import is_sequence_type


def to_numpy(batch: pa.RecordBatch, writable: bool = False, tensors: bool = False,
             where: Callable[[], str] = lambda: "a batch") -> dict[str, Any]:
    """{column: array}: equal-length list columns -> [B, T, ...] (zero-copy for numbers without nulls),
    scalars -> [B], strings -> object arrays, ragged lists -> object arrays of per-row arrays.
    writable: numbers are writable views of the decoded buffers (a copy only if Arrow's buffer is
    immutable). tensors: numbers as torch tensors sharing that memory (torch.from_numpy).
    A value that does not convert (a string that is not UTF-8) is an InputError starting with `where()`."""
    return hand_out(views(batch, writable, where), writable, tensors)


def views(batch: pa.RecordBatch, writable: bool, where: Callable[[], str] = lambda: "a batch",
          unsliced: bool = False) -> dict[str, Any]:
    """to_numpy's arrays, except that with `writable` the arrays of numbers may still be read-only views of
    Arrow's buffers: hand_out copies those, so a reading thread can do the rest ahead and the copy is made
    where the arrays are used (while the copied bytes are in the CPU's caches). `unsliced`: every array of the
    batch, children included, starts at offset 0 of its buffers (a batch as the Arrow IPC reader makes it, the
    format has no offsets), so columns of numbers are made from the batch's buffers, fetched in one call, with
    no pyarrow object per column or level."""
    return _made(batch, writable, where, unsliced)


def _made(batch: pa.RecordBatch, writable: bool, where: Callable[[], str], unsliced: bool,
          numbers_only: bool = False) -> dict[str, Any]:
    """views' arrays; with `numbers_only`, None for every column that is not of numbers (lists of them included)."""
    plan = _plan(batch)
    buffers = plan.flat(batch) if unsliced else None
    rows = batch.num_rows
    out: dict[str, Any] = {}
    for i, (name, convert, at) in enumerate(zip(plan.names, plan.converts, plan.at)):
        if numbers_only and not isinstance(convert, _Dense):
            out[name] = None
            continue
        try:
            array = None if buffers is None or at is None else convert.from_buffers(buffers, at, rows, writable)
            out[name] = convert(batch.column(i), writable) if array is None else array
        except (pa.ArrowException, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise InputError(f"{where()}, column {name!r}: corrupt ({first_line(exc)})") from exc
    return out


class StackViews:
    """views of the batches of stacks (formats.base.Stacked): each stack's arrays made once, on the thread that
    first asks for one of its batches (its last stack kept per thread, whichever read gave it again), and each
    batch's arrays their rows. A column is sliced only where that gives exactly what views makes of the batch
    alone and costs nothing to make for the whole stack: numbers (lists of them included) with no null at any
    level and, for lists, equal lengths across the stack (views of the stack's buffers); any other column
    (strings: a Python object a row) is made from the batch's own rows, so a random access (batchtool.source)
    makes no more than its batch."""

    def __init__(self, writable: bool, unsliced: bool) -> None:
        self.writable = writable
        self.unsliced = unsliced
        self._held = threading.local()

    def __call__(self, piece: Stacked, where: Callable[[], str] = lambda: "a batch") -> dict[str, Any]:
        held = getattr(self._held, "stack", None)
        if held is None or not held[0].same_stack(piece):
            held = self._held.stack = (piece, self._stack_arrays(piece.stack, where), _plan(piece.stack))
        stack, arrays, plan = held[0].stack, held[1], held[2]
        start = piece.index * piece.rows
        out = {}
        for i, (name, array) in enumerate(arrays.items()):
            try:
                out[name] = array[start:start + piece.rows] if array is not None else \
                    plan.converts[i](stack.column(i).slice(start, piece.rows), self.writable)
            except (pa.ArrowException, ValueError) as exc:
                raise InputError(f"{where()}, column {name!r}: corrupt ({first_line(exc)})") from exc
        return out

    def _stack_arrays(self, stack: pa.RecordBatch, where: Callable[[], str]) -> dict[str, np.ndarray | None]:
        """{column: the stack's array, or None where each batch's is made from its own rows}."""
        made = _made(stack, self.writable, where, self.unsliced, numbers_only=True)
        return {name: array if array is not None and _sliceable(stack.column(i), array) else None
                for i, (name, array) in enumerate(made.items())}


def _sliceable(column: pa.Array, array: np.ndarray) -> bool:
    """Whether rows of `array` (what views made of `column`) are what views makes of those rows alone, and are
    views, not objects."""
    if array.dtype == object:
        return False
    while True:  # no null at any level (a batch without one would convert to another dtype)
        if column.null_count:
            return False
        if not is_sequence_type(column.type):
            return True
        column = column.values


def hand_out(arrays: dict[str, Any], writable: bool, tensors: bool) -> dict[str, Any]:
    """views' arrays as to_numpy gives them: with `writable`, read-only numbers copied; with `tensors`, torch
    tensors sharing the numbers' memory."""
    if writable:
        arrays = {name: a if a.flags.writeable or a.dtype == object else a.copy() for name, a in arrays.items()}
    if tensors:
        import torch

        arrays = {name: torch.from_numpy(a) if a.dtype != object else a for name, a in arrays.items()}
    return arrays


_Convert = Callable[[pa.Array, bool], np.ndarray]


@dataclass(frozen=True)
class _Plan:
    """How each column of one schema converts, and where the buffers of its columns of numbers are among a batch's
    buffers flattened (RecordBatch.to_struct_array().buffers(): the struct's validity, then each column's, children
    depth first)."""

    names: tuple[str, ...]
    converts: tuple[_Convert, ...]
    at: tuple[tuple[int, ...] | None, ...]
    """Per column of numbers (_Dense), where its buffers are, flattened (_Dense.from_buffers); None for others."""
    buffers: int
    """Of a batch, flattened."""
    bitmaps: tuple[int, ...]
    """Where the validity bitmaps of the columns of numbers (every level) are, flattened."""

    def flat(self, batch: pa.RecordBatch) -> list[pa.Buffer | None] | None:
        """The buffers of `batch` (at offset 0 at every level), flattened in one call; None where a column of
        numbers has a validity bitmap at some level (it may have nulls: converted column by column), or the count
        is not the plan's."""
        buffers = batch.to_struct_array().buffers()
        if len(buffers) != self.buffers or any(map(is_not, map(buffers.__getitem__, self.bitmaps), repeat(None))):
            return None
        return buffers


_plans: list[tuple[pa.Schema, _Plan]] = []
"""The schemas seen last with their plans: an epoch's batches share a handful of schemas, and comparing a batch's
schema with its reader's is a pointer comparison (hashing a schema costs more than converting a column)."""
PLANS_KEPT = 16


def _plan(batch: pa.RecordBatch) -> _Plan:
    """The plan of `batch`'s schema, decided once per schema: numbers, and lists of them nested to any depth,
    through _Dense; any other type through column_to_numpy."""
    schema = batch.schema
    for known, plan in _plans:
        if known.equals(schema):
            return plan
    counts = [len(column.buffers()) for column in batch.columns]
    converts = tuple(_Dense.of(field.type) or column_to_numpy for field in schema)
    firsts = [1 + int(n) for n in np.cumsum([0, *counts[:-1]])]
    dense = [(convert, first) for convert, first in zip(converts, firsts) if isinstance(convert, _Dense)]
    at = tuple(tuple(first + i for i in convert.data) if isinstance(convert, _Dense) else None
               for convert, first in zip(converts, firsts))
    bitmaps = tuple(first + i for convert, first in dense for i in convert.validity)
    plan = _Plan(tuple(schema.names), converts, at, 1 + sum(counts), bitmaps)
    _plans[:] = [(schema, plan), *_plans[:PLANS_KEPT - 1]]
    return plan


@dataclass(frozen=True)
class _Dense:
    """A column of numbers, or of lists of numbers nested to any depth, as the [N, T1, T2, ...] array
    column_to_numpy makes of it when no level has a null and every variable-length level has equal lengths
    (the offsets of each such level are read once and compared, no per-level array is sliced); else what
    column_to_numpy makes of it."""

    levels: tuple[int | np.dtype, ...]
    """Per list level, outermost first: a fixed size's steps, or a variable-length list's offsets dtype."""
    dtype: np.dtype
    """Of the numbers (the innermost values)."""
    validity: tuple[int, ...]
    """Per level, then the numbers: where its validity bitmap is among the column's buffers flattened
    (Array.buffers(): a list's validity and offsets, a fixed-size list's validity, then its child's)."""
    data: tuple[int, ...]
    """Per level, then the numbers: where its offsets (a fixed size: its validity bitmap, absent where
    from_buffers reads), or the numbers, are among them."""

    @staticmethod
    def of(kind: pa.DataType) -> _Dense | None:
        levels: list[int | np.dtype] = []
        validity: list[int] = []
        data: list[int] = []
        at = 0
        while is_sequence_type(kind):
            fixed = pa.types.is_fixed_size_list(kind)
            levels.append(kind.list_size if fixed else np.dtype(np.int64 if pa.types.is_large_list(kind) else np.int32))
            validity.append(at)
            data.append(at if fixed else at + 1)
            at += 1 if fixed else 2
            kind = kind.value_type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            return None
        return _Dense(tuple(levels), np.dtype(kind.to_pandas_dtype()), (*validity, at), (*data, at + 1))

    def __call__(self, arr: pa.Array, writable: bool) -> np.ndarray:
        """With `writable`, read-only numbers are left to hand_out to copy."""
        values = self._values(arr) if len(arr) else None
        if values is None:
            return column_to_numpy(arr, writable)
        return values if writable else _handed_out(values, False)

    def from_buffers(self, buffers: list[pa.Buffer | None], at: tuple[int, ...], rows: int,
                     writable: bool) -> np.ndarray | None:
        """What __call__ makes of a column of `rows` rows at offset 0 at every level, without validity bitmaps
        (_Plan.flat), whose `data` buffers are at `at` of `buffers`; None to leave it to __call__ (unequal
        lengths, no rows)."""
        if not rows:
            return None
        values = np.frombuffer(buffers[at[0]], dtype=self.dtype, count=rows) if len(at) == 1 \
            else self._shaped(rows, [(buffers[i], 0) for i in at])  # (most columns are plain numbers: one view)
        return values if writable or values is None else _handed_out(values, False)

    def _values(self, arr: pa.Array) -> np.ndarray | None:
        """The numbers' view in their shape, or None where a level has a null or unequal lengths."""
        level, parts = arr, []
        for steps in self.levels:
            if level.null_count:
                return None
            parts.append((None if isinstance(steps, int) else level.buffers()[1], level.offset))
            level = level.values
        if level.null_count:
            return None
        parts.append((level.buffers()[1], level.offset))
        return self._shaped(len(arr), parts)

    def _shaped(self, count: int, parts: list[tuple[pa.Buffer | None, int]]) -> np.ndarray | None:
        """The numbers' view in their shape, of `count` rows without nulls, from each level's offsets buffer
        (ignored for a fixed size) and the numbers' buffer, each with its array's offset; None where lengths are
        unequal."""
        start, shape = 0, [count]
        for steps, (buffer, offset) in zip(self.levels, parts):
            start += offset
            if isinstance(steps, int):
                if not steps:
                    return None
                start, count = start * steps, count * steps
            else:
                offsets = np.frombuffer(buffer, dtype=steps, count=count + 1, offset=start * steps.itemsize)
                first, end = int(offsets[0]), int(offsets[-1])
                steps = (end - first) // count
                if steps < 1 or offsets.tobytes() != np.arange(first, end + 1, steps, dtype=offsets.dtype).tobytes():
                    return None  # (equal lengths: the offsets are first, first + steps, ..., end, byte for byte)
                start, count = first, end - first
            shape.append(steps)
        buffer, offset = parts[-1]
        start += offset
        return np.frombuffer(buffer, dtype=self.dtype, count=count, offset=start * self.dtype.itemsize).reshape(shape)


def column_to_numpy(arr: pa.Array, writable: bool = False) -> np.ndarray:
    if not is_sequence_type(arr.type):
        return _leaf(arr, writable)
    dense = _dense(arr, writable)
    if dense is not None:
        return dense
    out = np.empty(len(arr), dtype=object)
    for i in range(len(arr)):
        out[i] = None if not arr[i].is_valid else column_to_numpy(arr[i].values, writable)
    return out


def _leaf(arr: pa.Array, writable: bool) -> np.ndarray:
    """Numbers without nulls: a view of Arrow's values buffer, read-only unless `writable` (then writable where
    that buffer is, freshly decoded memory, and copied where it is not, a read-only map)."""
    values = _without_pandas(arr)
    return _handed_out(arr.to_numpy(zero_copy_only=False) if values is None else values, writable)


def _handed_out(values: np.ndarray, writable: bool) -> np.ndarray:
    """`values` as to_numpy hands them out: writable (a copy of read-only memory), or not (a read-only view)."""
    if writable:
        return values if values.flags.writeable else values.copy()
    if values.base is not None and values.flags.writeable:  # a view of Arrow's memory: hand it out read-only
        values = values.view()
        values.flags.writeable = False
    return values


def _without_pandas(arr: pa.Array) -> np.ndarray | None:
    """Numbers, strings, bytes and booleans as pyarrow's to_numpy gives them (numbers with nulls as floats with
    NaN, the others with nulls as object arrays), without it: every to_numpy call goes through pyarrow's pandas
    glue, whose first use imports pandas when installed (0.3 s of a first epoch, in every DataLoader worker).
    None for other types (dates, decimals), which to_numpy converts."""
    kind = arr.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind):
        out = np.empty(len(arr), dtype=object)
        out[:] = arr.to_pylist()
        return out
    if pa.types.is_boolean(kind):
        if arr.null_count:
            out = np.empty(len(arr), dtype=object)
            out[:] = arr.to_pylist()
            return out
        return _bits(arr.buffers()[1], arr.offset, len(arr))
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        values = np.frombuffer(arr.buffers()[1], dtype=kind.to_pandas_dtype(), count=arr.offset + len(arr))
        values = values[arr.offset:]
        if not arr.null_count:
            return values
        out = values.astype(np.float64 if pa.types.is_integer(kind) else values.dtype)
        out[~_bits(arr.buffers()[0], arr.offset, len(arr))] = np.nan
        return out
    return None


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """A bitmap's bits [offset, offset + length) as booleans."""
    return np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")[offset:offset + length].astype(bool)


def _dense(arr: pa.Array, writable: bool) -> np.ndarray | None:
    """[N, T, ...] view of a list column whose rows all have T steps and no nulls, else None."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        steps = arr.type.list_size
        values = arr.values.slice(arr.offset * steps, len(arr) * steps)
    else:
        offsets = _without_pandas(arr.offsets)
        lengths = np.diff(offsets)
        if len(lengths) and (lengths != lengths[0]).any():
            return None
        steps = int(lengths[0]) if len(lengths) else 0
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    inner = column_to_numpy(values, writable)
    if inner.dtype == object and is_sequence_type(values.type):
        return None
    return inner.reshape(len(arr), steps, *inner.shape[1:])
