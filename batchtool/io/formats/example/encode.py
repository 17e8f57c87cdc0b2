"""Arrow record batches -> serialized tf.train.SequenceExample / Example records, the bytes C++ protobuf's
deterministic output would write, built column by column with NumPy."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from itertools import pairwise
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core.errors import RowError, SchemaError, UsageError, where
from batchtool.io.formats.example.columns import INT64_MAX, ColumnShape, check_kind, column_shape
from batchtool.io.formats.example.ragged import exclusive_cumsum, ragged_positions, segment_sums

_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def _varint(value: int) -> bytes:
    """Protobuf varint of a non-negative int (used once per record, for lengths)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_matrix(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of uint64 values as rows of a uint8 matrix, and each row's used length."""
    sizes = np.searchsorted(_VARINT_LIMITS, values, side="right").astype(np.int64) + 1
    width = int(sizes.max(initial=1))
    columns = np.arange(width, dtype=np.uint64)
    groups = ((values[:, None] >> (columns * np.uint64(7))) & np.uint64(0x7F)).astype(np.uint8)
    groups[np.arange(width) < (sizes - 1)[:, None]] |= 0x80
    return groups, sizes


def _encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated varint bytes of uint64 values, and the byte length of each."""
    if values.size and int(values.max()) < 0x80:
        return values.astype(np.uint8), np.ones(values.size, dtype=np.int64)
    groups, sizes = _varint_matrix(values)
    return groups[np.arange(groups.shape[1]) < sizes[:, None]], sizes


def _wrap(flat: np.ndarray, lengths: np.ndarray,
          layers: Sequence[tuple[bytes, bool]]) -> tuple[np.ndarray, np.ndarray]:
    """Wrap each item (a run of flat) in length-delimited headers, innermost layer first.

    A layer is (prefix, omit_empty): the item becomes prefix + varint(len) + item,
    or stays empty when omit_empty and it is empty (protobuf writes no empty
    packed list). All layers are applied in one pass over the bytes.
    """
    blocks: list[np.ndarray] = []
    block_sizes: list[np.ndarray] = []
    for prefix, omit_empty in layers:
        varints, sizes = _varint_matrix(lengths.astype(np.uint64))
        fixed = np.broadcast_to(np.frombuffer(prefix, dtype=np.uint8), (len(lengths), len(prefix)))
        size = sizes + len(prefix)
        if omit_empty:
            size = np.where(lengths > 0, size, 0)
        blocks.insert(0, np.hstack([fixed, varints]))
        block_sizes.insert(0, size)
        lengths = lengths + size
    header_matrix = np.hstack(blocks)
    used = np.hstack([np.arange(block.shape[1]) < size[:, None] for block, size in zip(blocks, block_sizes)])
    header_sizes = np.sum(block_sizes, axis=0)
    out = np.empty(flat.size + int(header_sizes.sum()), dtype=np.uint8)
    header_positions = ragged_positions(exclusive_cumsum(lengths)[:-1], header_sizes)
    body = np.ones(out.size, dtype=bool)
    body[header_positions] = False
    out[header_positions] = header_matrix[used]
    out[body] = flat
    return out, lengths


Fail = Callable[..., NoReturn]
"""fail(test, message[, depth]): RowError at the first row holding a value (at that list depth) for which test is
true; it carries how to find such a row in another column (RowError.refind: the input's, where the column came
from)."""


def first_row(column: pa.Array, depth: int, test: Callable[[pa.Array], np.ndarray]) -> int | None:
    """The first row of `column` holding a value `depth` lists down (or as deep as it nests: an input column an
    operation put in lists, as pack does) for which `test` (of those values, vectorised) is true; None if none."""
    values, rows = column, np.arange(len(column))
    for _ in range(depth):
        if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
                or pa.types.is_fixed_size_list(values.type)):
            break
        rows = rows[pc.list_parent_indices(values).to_numpy(zero_copy_only=False)]
        values = pc.list_flatten(values)
    hits = np.flatnonzero(test(values))
    return int(rows[hits[0]]) if hits.size else None


def null(values: pa.Array) -> np.ndarray:
    """Which values are null (a tf.train.Feature holds none)."""
    return values.is_null().to_numpy(zero_copy_only=False)


def beyond_int64(values: pa.Array) -> np.ndarray:
    """Which values an Int64List cannot hold: unsigned ones above the int64 range."""
    if values.type != pa.uint64():
        return np.zeros(len(values), dtype=bool)
    return pc.fill_null(pc.greater(values, pa.scalar(INT64_MAX, pa.uint64())), False).to_numpy(zero_copy_only=False)


def _int_payload(leaf: pa.Array, fail: Fail) -> np.ndarray:
    """Integer/bool values as the uint64 bit patterns of their int64 Feature values."""
    if pa.types.is_boolean(leaf.type):
        return leaf.to_numpy(zero_copy_only=False).astype(np.uint64)
    ints = leaf.to_numpy()
    if ints.dtype == np.uint64 and (ints > INT64_MAX).any():
        fail(beyond_int64, f"a value exceeds the int64 range of tf.train.Int64List ({leaf.type})")
    return ints.astype(np.int64).view(np.uint64)


def _bytes_payload(leaf: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated bytes of string/binary values and each value's length."""
    leaf = leaf.cast(pa.large_binary())
    _, offsets_buffer, data_buffer = leaf.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[leaf.offset:leaf.offset + len(leaf) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return data[offsets[0]:offsets[-1]], np.diff(offsets)


def _encode_features(leaf: pa.Array, counts: np.ndarray, kind: str, outer: Sequence[tuple[bytes, bool]],
                     fail: Fail) -> tuple[np.ndarray, np.ndarray]:
    """Serialized Features (then wrapped in `outer` layers), one per count, over the flat leaf values."""
    if kind == "int64":
        payload, sizes = _encode_varints(_int_payload(leaf, fail))
        return _wrap(payload, segment_sums(sizes, counts), [(b"\x0a", True), (b"\x1a", False), *outer])
    if kind == "float":
        payload = np.ascontiguousarray(leaf.to_numpy(zero_copy_only=False), dtype="<f4").view(np.uint8)
        return _wrap(payload, counts * 4, [(b"\x0a", True), (b"\x12", False), *outer])
    data, lengths = _bytes_payload(leaf)
    values, sizes = _wrap(data, lengths, [(b"\x0a", False)])
    return _wrap(values, segment_sums(sizes, counts), [(b"\x0a", False), *outer])


def _lengths(column: pa.Array) -> np.ndarray:
    """Lengths of the non-null lists of a list column."""
    return pc.list_value_length(column).drop_null().to_numpy().astype(np.int64)


def _split(flat: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> list[bytes]:
    """Cut flat into one bytes object per valid row; b"" for null rows."""
    data = flat.tobytes()
    bounds = exclusive_cumsum(lengths).tolist()
    pieces = [data[a:b] for a, b in pairwise(bounds)]
    if valid.all():
        return pieces
    out = [b""] * len(valid)
    for row, piece in zip(np.flatnonzero(valid).tolist(), pieces):
        out[row] = piece
    return out


def _failing(name: str, column: pa.Array, depth: int) -> Fail:
    def fail(test: Callable[[pa.Array], np.ndarray], message: str, level: int = depth) -> NoReturn:
        refind = functools.partial(first_row, depth=level, test=test)
        raise RowError(refind(column) or 0, name, message, refind=refind)
    return fail


def _leaf(column: pa.Array, shape: ColumnShape, as_feature_list: bool, fail: Fail) -> tuple[pa.Array, np.ndarray]:
    """A column's values (every non-null one, through its lists) and the values per Feature; RowError where a value
    or a feature-list step is null, which a tf.train.Feature cannot hold."""
    depth = len(shape.lists)
    leaf = column.drop_null() if depth == 0 else pc.list_flatten(column)
    if depth == 2:
        if leaf.null_count:
            fail(null, "a feature-list step is null; steps must be lists (empty for no values)", 1)
        counts, leaf = _lengths(leaf), pc.list_flatten(leaf)
    else:
        counts = _lengths(column) if depth == 1 and not as_feature_list else np.ones(len(leaf), dtype=np.int64)
    if leaf.null_count:
        fail(null, "a value inside a list is null; tf.train.Feature cannot hold nulls")
    return leaf, counts


def _encode_column(name: str, column: pa.Array, shape: ColumnShape, as_feature_list: bool) -> list[bytes]:
    """Each row's serialized map entry (key, Feature or FeatureList) for one column; b"" where null."""
    fail = _failing(name, column, len(shape.lists))
    key = name.encode("utf-8")
    entry = [(b"\x0a" + _varint(len(key)) + key + b"\x12", False), (b"\x0a", False)]
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    leaf, counts = _leaf(column, shape, as_feature_list, fail)
    if not as_feature_list:
        flat, lengths = _encode_features(leaf, counts, shape.kind, entry, fail)
    else:
        flat, lengths = _encode_features(leaf, counts, shape.kind, [(b"\x0a", False)], fail)
        flat, lengths = _wrap(flat, segment_sums(lengths, _lengths(column)), entry)
    return _split(flat, lengths, valid)


def _plan(field: pa.Field, kind: str, sequence_columns: Collection[str] | None) -> tuple[ColumnShape, bool]:
    """A column's shape and whether it becomes a feature list (else a context feature)."""
    shape = column_shape(field, kind)
    depth = len(shape.lists)
    if kind == "example":
        return shape, False
    if sequence_columns is None:
        return shape, depth > 0
    chosen = field.name in sequence_columns
    if chosen and depth == 0:
        raise SchemaError(f"{where(column=field.name)}: listed as a sequence column but has the scalar type "
                          f"{field.type}; a feature list needs a list column")
    if depth == 2 and not chosen:
        raise SchemaError(f"{where(column=field.name)}: type {field.type} can only be a feature list, "
                          "but it is not among the sequence columns")
    return shape, chosen


def _message(field_tag: bytes, body: bytes) -> bytes:
    """A length-delimited field, or nothing when the body is empty (the field is left unset)."""
    return field_tag + _varint(len(body)) + body if body else b""


def _columns(batch: pa.RecordBatch, kind: str,
             sequence_columns: Collection[str] | None) -> list[tuple[pa.Field, pa.Array, ColumnShape, bool]]:
    """Each column with its shape and whether it becomes a feature list, sorted by name (the order records hold
    them); SchemaError for a batch no record can hold (a column of a type a Feature cannot hold, float64)."""
    check_kind(kind)
    names = batch.schema.names
    if len(set(names)) != len(names):
        raise SchemaError(f"duplicate column names {sorted(n for n in set(names) if names.count(n) > 1)}; "
                          "feature names must be unique")
    if sequence_columns is not None:
        if kind == "example":
            raise UsageError("sequence_columns applies to sequence_example records only")
        unknown = sorted(set(sequence_columns) - set(names))
        if unknown:
            raise SchemaError(f"sequence columns {unknown} are not columns of the batch (columns: {names})")
    out = []
    for field, column in sorted(zip(batch.schema, batch.columns), key=lambda pair: pair[0].name.encode("utf-8")):
        shape, as_feature_list = _plan(field, kind, sequence_columns)
        if pa.types.is_float64(shape.leaf):
            raise SchemaError(f"{where(column=field.name)}: {field.type} cannot be stored exactly in a "
                              "tf.train.FloatList, which holds float32; cast the column to float32 first")
        out.append((field, column, shape, as_feature_list))
    return out


def check_values(batch: pa.RecordBatch, kind: str = "sequence_example", *,
                 sequence_columns: Collection[str] | None = None) -> None:
    """What encode_records would refuse in this batch, without encoding it: RowError at the first row (a null in a
    list, an integer beyond int64), SchemaError for a column no record can hold. For a caller that knows where the
    batch's rows come from (dataset.located), so that the error names the file and row."""
    for field, column, shape, as_feature_list in _columns(batch, kind, sequence_columns):
        fail = _failing(field.name, column, len(shape.lists))
        leaf, _ = _leaf(column, shape, as_feature_list, fail)
        if shape.kind == "int64":
            _int_payload(leaf, fail)


def encode_records(batch: pa.RecordBatch, kind: str = "sequence_example", *,
                   sequence_columns: Collection[str] | None = None) -> list[bytes]:
    """Serialize each row as a tf.train.SequenceExample (or Example), the inverse of decode_records.

    SequenceExample: list columns become feature lists (one Feature per step;
    a nested list step holds its values), or only the sequence_columns if
    given, other lists then being context list features; scalars are context
    features. Example: scalars become one-value features, lists multi-value
    features. Integers and bools -> int64_list; float16 and float32 -> float_list;
    strings and binary -> bytes_list. Every conversion is exact: float64 (which
    tf.train.FloatList cannot hold) and uint64 values above the int64 range are
    refused, naming the column. A null is an omitted feature. Features and
    feature lists are written sorted by name (the bytes of C++ protobuf's
    deterministic output).
    """
    context: list[list[bytes]] = []
    lists: list[list[bytes]] = []
    for field, column, shape, as_feature_list in _columns(batch, kind, sequence_columns):
        (lists if as_feature_list else context).append(_encode_column(field.name, column, shape, as_feature_list))
    rows = batch.num_rows
    context_rows = [b"".join(parts) for parts in zip(*context)] if context else [b""] * rows
    list_rows = [b"".join(parts) for parts in zip(*lists)] if lists else [b""] * rows
    return [_message(b"\x0a", c) + _message(b"\x12", f) for c, f in zip(context_rows, list_rows)]
