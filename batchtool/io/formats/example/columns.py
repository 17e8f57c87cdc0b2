"""Which Arrow column types a tf.train.Feature can hold, and how they nest: what both the decoder and the encoder
check a schema against."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from batchtool.core.errors import SchemaError, UsageError, where
from batchtool.io.formats.declared import TFRECORD_KINDS as KINDS

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_list(t: pa.DataType) -> bool:
    """List-like types a column may nest: list, large_list, fixed_size_list."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _leaf_kind(t: pa.DataType) -> str | None:
    """The Feature value kind that holds an Arrow leaf type, or None if none can."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_floating(t):
        return "float"
    if t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    return None


@dataclass(frozen=True)
class ColumnShape:
    """How a column's type nests: its list types (outermost first) and its leaf type and kind."""

    lists: tuple[pa.DataType, ...]
    leaf: pa.DataType
    kind: str


def column_shape(field: pa.Field, kind: str) -> ColumnShape:
    """The shape of a column, or SchemaError if tf.train.Feature cannot hold it in this kind."""
    lists, t = [], field.type
    while _is_list(t):
        lists.append(t)
        t = t.value_type
    leaf_kind = _leaf_kind(t)
    max_depth = 2 if kind == "sequence_example" else 1
    if leaf_kind is None or len(lists) > max_depth:
        allowed = "a scalar, a list, or (SequenceExample only) a list of lists"
        raise SchemaError(f"{where(column=field.name)}: type {field.type} cannot be stored in a "
                          f"{kind}; expected {allowed} of integers, bools, floats, strings or binary "
                          "(fixed-size included)")
    return ColumnShape(tuple(lists), t, leaf_kind)


def check_kind(kind: str) -> None:
    """Reject a kind other than 'example' or 'sequence_example'."""
    if kind not in KINDS:
        raise UsageError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
