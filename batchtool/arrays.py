"""Record batches as NumPy arrays shaped [batch, time, ...]: zero-copy where Arrow's buffers allow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.errors import InputError
from batchtool.formats.base import first_line
from batchtool.stats import is_sequence_type


def to_numpy(batch: pa.RecordBatch, writable: bool = False, tensors: bool = False,
             where: Callable[[], str] = lambda: "a batch") -> dict[str, Any]:
    """{column: array}: equal-length list columns -> [B, T, ...] (zero-copy for numbers without nulls),
    scalars -> [B], strings -> object arrays, ragged lists -> object arrays of per-row arrays.
    writable: numbers are writable views of the decoded buffers (a copy only if Arrow's buffer is
    immutable). tensors: numbers as torch tensors sharing that memory (torch.from_numpy).
    A value that does not convert (a string that is not UTF-8) is an InputError starting with `where()`."""
    out = {}
    for i, name in enumerate(batch.schema.names):
        try:
            out[name] = column_to_numpy(batch.column(i), writable)
        except (pa.ArrowException, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise InputError(f"{where()}, column {name!r}: corrupt ({first_line(exc)})") from exc
    if tensors:
        import torch

        out = {name: torch.from_numpy(a) if a.dtype != object else a for name, a in out.items()}
    return out


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
    values = arr.to_numpy(zero_copy_only=False)
    if not writable or values.flags.writeable:
        return values
    data = arr.buffers()[1] if len(arr.buffers()) > 1 else None
    if (data is not None and data.is_mutable and not arr.null_count
            and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type))):
        return np.frombuffer(data, dtype=values.dtype, count=len(arr), offset=arr.offset * values.itemsize)
    return values.copy()


def _dense(arr: pa.Array, writable: bool) -> np.ndarray | None:
    """[N, T, ...] view of a list column whose rows all have T steps and no nulls, else None."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        steps = arr.type.list_size
        values = arr.values.slice(arr.offset * steps, len(arr) * steps)
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and (lengths != lengths[0]).any():
            return None
        steps = int(lengths[0]) if len(lengths) else 0
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    inner = column_to_numpy(values, writable)
    if inner.dtype == object and is_sequence_type(values.type):
        return None
    return inner.reshape(len(arr), steps, *inner.shape[1:])
