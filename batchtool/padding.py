"""Padding sequence (list) columns to a common length: shared by bucket, segment and balanced batches."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.errors import SchemaError, UsageError
from batchtool.stats import is_sequence_type


def parse_pad_values(specs: Sequence[str], schema: pa.Schema) -> dict[str, Any]:
    """'tokens=0', 'frames=-1.5', 'words=<pad>' -> {column: value of the column's element type}."""
    values: dict[str, Any] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep:
            raise UsageError(f"--pad-value {spec!r}: expected COLUMN=VALUE")
        if name not in schema.names:
            raise UsageError(f"--pad-value {spec!r}: no column {name!r} (available: {', '.join(schema.names)})")
        element = element_type(schema.field(name).type)
        try:
            if pa.types.is_integer(element):
                values[name] = int(text)
            elif pa.types.is_floating(element):
                values[name] = float(text)
            elif pa.types.is_boolean(element):
                values[name] = text.lower() in ("1", "true", "yes")
            else:
                values[name] = text
        except ValueError:
            raise UsageError(f"--pad-value {spec!r}: {text!r} is not a {element} value") from None
    return values


def element_type(t: pa.DataType) -> pa.DataType:
    """The scalar type inside list / fixed_size_list nesting."""
    while is_sequence_type(t):
        t = t.value_type
    return t


def default_pad(t: pa.DataType) -> Any:
    """0 for numbers, False for booleans, the empty string for strings (TensorFlow's PaddingFIFOQueue)."""
    e = element_type(t)
    if pa.types.is_string(e) or pa.types.is_large_string(e):
        return ""
    if pa.types.is_binary(e) or pa.types.is_large_binary(e):
        return b""
    if pa.types.is_boolean(e):
        return False
    return 0


def row_lengths(arr: pa.Array) -> np.ndarray:
    """Steps per row of a list column (a null row has 0 steps)."""
    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def sequence_lengths(batch: pa.RecordBatch, columns: Sequence[str], locate: Callable[[int], str]) -> np.ndarray:
    """The shared time length of several sequence columns; an error names the first row where they disagree."""
    lengths = None
    for name in columns:
        if not is_sequence_type(batch.schema.field(name).type):
            raise SchemaError(f"column {name!r} is {batch.schema.field(name).type}, not a sequence (list) column")
        these = row_lengths(batch.column(name))
        if lengths is None:
            lengths = these
            first = name
            continue
        bad = np.flatnonzero(these != lengths)
        if len(bad):
            i = int(bad[0])
            raise SchemaError(f"{locate(i)}: sequence columns disagree in length: {first!r} has {lengths[i]} "
                              f"steps, {name!r} has {these[i]}")
    return lengths if lengths is not None else np.zeros(batch.num_rows, dtype=np.int64)


def pad_list_column(arr: pa.Array, length: int, pad_value: Any) -> pa.Array:
    """Every row padded on the right to exactly `length` steps (rows must not be longer)."""
    lens = row_lengths(arr)
    n = len(arr)
    if n and lens.max(initial=0) > length:
        raise ValueError(f"a row has {lens.max()} steps, more than the padded length {length}")
    values = arr.flatten()
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if n else np.zeros(0, dtype=np.int64)
    step = np.arange(int(lens.sum())) - np.repeat(starts, lens)
    dest = np.repeat(np.arange(n) * length, lens) + step
    padded = _scatter(values, dest, n * length, pad_value)
    offsets = pa.array((np.arange(n + 1) * length).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, padded, type=pa.list_(arr.type.value_field))


def _scatter(values: pa.Array, dest: np.ndarray, size: int, pad_value: Any) -> pa.Array:
    """Place values at dest positions of an array of `size` steps filled with pad_value."""
    if pa.types.is_fixed_size_list(values.type):
        width = values.type.list_size
        inner_dest = (dest[:, None] * width + np.arange(width)).ravel()
        inner = values.flatten()
        return pa.FixedSizeListArray.from_arrays(_scatter(inner, inner_dest, size * width, pad_value),
                                                 type=values.type)
    t = values.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t)) and values.null_count == 0:
        out = np.full(size, pad_value, dtype=t.to_pandas_dtype())
        out[dest] = values.to_numpy(zero_copy_only=False)
        return pa.array(out, type=t)
    index = np.full(size, -1, dtype=np.int64)
    index[dest] = np.arange(len(dest))
    taken = values.take(pa.array(index, mask=index < 0))
    return pc.fill_null(taken, pa.scalar(pad_value, type=t)) if len(dest) < size else taken


def pad_batch(batch: pa.RecordBatch, columns: Sequence[str], length: int,
              pad_values: Mapping[str, Any]) -> pa.RecordBatch:
    """The batch with the given sequence columns padded to `length` steps; other columns unchanged."""
    arrays = [pad_list_column(batch.column(f.name), length, pad_values.get(f.name, default_pad(f.type)))
              if f.name in columns else batch.column(f.name) for f in batch.schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(
        [pa.field(f.name, pa.list_(f.type.value_field)) if f.name in columns else f for f in batch.schema]))


def mask_column(lengths: np.ndarray, length: int) -> pa.Array:
    """list<bool> of `length` steps per row, True on real steps: what a trainer multiplies its loss by."""
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    offsets = pa.array((np.arange(len(mask) + 1) * length).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(mask.ravel()))
