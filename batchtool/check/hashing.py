"""Stable 64-bit hashes of rows (any subset of columns), for finding duplicate keys and rows in bounded memory.

A row is hashed with blake2b over its exact content: each column is decomposed
into flat "parts" (fixed-width value buffers, string bytes, element lengths,
null flags) plus, per row, the size of every part's slice, so different rows can
only share a hash by a 64-bit collision, never by construction. The result is
the same on every run, thread count and machine (little-endian buffers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core.errors import SchemaError

Bounds = np.ndarray | tuple[int, int]
"""Element offsets of each row into a part's values: an int64 array of n + 1 offsets, or (first, step)
for the uniform offsets first + step * i of fixed-width data (never materialised for the leaves)."""


class FlatPart(NamedTuple):
    """Flat values and bounds: row i's content is values[bounds[i]:bounds[i + 1]].

    A `nulls` part flags null slots (1 = null) of one nesting level. It is present for every
    level whatever the data, but hashed only for rows that hold a null (values is None when the
    chunk has none), so a row hashes the same whether or not other rows in its chunk are null.
    """

    values: np.ndarray | None
    bounds: Bounds
    nulls: bool = False


def row_hashes(batch: pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """uint64 per row: a digest of the values of `columns`, compared as stored except that NaN equals NaN."""
    parts: list[FlatPart] = []
    for name in columns:
        try:
            parts += _parts(batch.column(name))
        except SchemaError as exc:
            raise SchemaError(f"column {name!r}: {exc}") from None
    n = batch.num_rows
    present = [(j, p) for j, p in enumerate(parts) if p.values is not None]
    row_bounds = [_materialise(p.bounds, n) for _, p in present]
    # per row: each part's slice size, or for a nulls part its null count (0 when the chunk has no nulls)
    sizes = np.zeros((n, len(parts)), dtype="<i8")
    for (j, p), b in zip(present, row_bounds):
        if p.nulls:
            cum = np.concatenate([[0], np.cumsum(p.values, dtype=np.int64)])
            sizes[:, j] = cum[b[1:]] - cum[b[:-1]]
        else:
            sizes[:, j] = np.diff(b)
    header = memoryview(sizes).cast("B")
    width = 8 * len(parts)
    views = [memoryview(np.ascontiguousarray(p.values)).cast("B") for _, p in present]
    byte_bounds = [(b * p.values.itemsize).tolist() for (_, p), b in zip(present, row_bounds)]
    gates = [sizes[:, j].tolist() if p.nulls else None for j, p in present]
    digests = bytearray(8 * n)
    for i in range(n):
        h = hashlib.blake2b(header[i * width:(i + 1) * width], digest_size=8)
        for view, bounds, gate in zip(views, byte_bounds, gates):
            if gate is None or gate[i]:
                h.update(view[bounds[i]:bounds[i + 1]])
        digests[8 * i:8 * i + 8] = h.digest()
    return np.frombuffer(bytes(digests), dtype="<u8").astype(np.uint64)


def _parts(arr: pa.Array) -> list[FlatPart]:
    """Parts that together determine every row's value exactly; which parts exist depends only on the type."""
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        return _parts(arr.dictionary_decode())
    if pa.types.is_null(t):
        return []
    nulls = FlatPart(arr.is_null().to_numpy(zero_copy_only=False).astype(np.uint8) if arr.null_count else None,
                 (0, 1), nulls=True)
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_temporal(t) or pa.types.is_floating(t):
        return [nulls, FlatPart(_fixed_values(arr), (0, 1))]
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
        flat = pc.fill_null(arr.cast(pa.large_binary()), b"")
        offsets = np.frombuffer(flat.buffers()[1], dtype=np.int64)[flat.offset:flat.offset + n + 1]
        data = flat.buffers()[2]
        return [nulls, FlatPart(np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8),
                            offsets)]
    if pa.types.is_fixed_size_list(t):
        return [nulls, *_nest(_parts(arr.values), (arr.offset * t.list_size, t.list_size), n)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return [nulls, *_nest(_parts(arr.values), arr.offsets.to_numpy().astype(np.int64), n)]
    if pa.types.is_struct(t):
        return [nulls, *(p for i in range(t.num_fields) for p in _parts(arr.field(i)))]
    raise SchemaError(f"cannot compare values of type {t}")


def _nest(child: list[FlatPart], offsets: Bounds, n: int) -> list[FlatPart]:
    """Parts of a list column from its child's parts: row i spans child elements offsets[i]..offsets[i+1].

    A child part of variable width per element also contributes its element sizes, so
    [["ab"], ["c"]] and [["a"], ["bc"]] stay apart.
    """
    out: list[FlatPart] = []
    for part in child:
        if isinstance(part.bounds, np.ndarray) and not part.nulls:
            out.append(FlatPart(np.diff(part.bounds), offsets))
        out.append(part._replace(bounds=_compose(part.bounds, offsets, n)))
    return out


def _compose(bounds: Bounds, offsets: Bounds, n: int) -> Bounds:
    """bounds[offsets]: the child's value offsets at each row's first element."""
    if isinstance(bounds, tuple) and isinstance(offsets, tuple):
        return bounds[0] + bounds[1] * offsets[0], bounds[1] * offsets[1]
    if isinstance(bounds, tuple):
        return bounds[0] + bounds[1] * offsets
    return bounds[_materialise(offsets, n)]


def _materialise(bounds: Bounds, n: int) -> np.ndarray:
    if isinstance(bounds, tuple):
        return bounds[0] + bounds[1] * np.arange(n + 1, dtype=np.int64)
    return bounds


def _fixed_values(arr: pa.Array) -> np.ndarray:
    """Values as fixed-width little-endian numbers: nulls 0, every NaN the same NaN."""
    t = arr.type
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.uint8())
    elif pa.types.is_temporal(t):
        arr = arr.view(pa.int64() if t.bit_width == 64 else pa.int32())
    values = (pc.fill_null(arr, 0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(t) and len(values) and np.isnan(values.max()):  # max propagates NaN: one cheap pass
        values = values.copy()
        values[np.isnan(values)] = np.nan
    return values
