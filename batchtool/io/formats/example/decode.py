"""Serialized tf.train.Example / SequenceExample records -> an Arrow record batch of a given schema.

Each column's Features are found by protobuf's C parser (the view messages) and their values
decoded in bulk with NumPy; only unusual encodings go through protobuf's parser one Feature at
a time, which also gives the exact error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core.errors import CorruptRecordError, InputError, where
from batchtool.io.formats import column_types
from batchtool.io.formats.base import rows_only
from batchtool.io.formats.example.columns import INT64_MAX, INT64_MIN, ColumnShape, check_kind, column_shape
from batchtool.io.formats.example.messages import (KIND_FIELD, ONEOF_KINDS, BadFeature, check_records, check_steps,
                                                parse_feature, parse_records)
from batchtool.io.formats.example.ragged import SLICE, exclusive_cumsum, ragged_positions, segment_sums
from batchtool.io.formats.wire import PAD, read_varints

_KIND_TAG = {kind: number << 3 | 2 for number, kind in enumerate(ONEOF_KINDS) if kind}
"""Value kind -> the wire tag byte of its (length-delimited) Feature field."""
_KIND_ARROW = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}
_LEN_TAG = 0x0A  # field 1, length-delimited: packed list, map entry, map key, repeated element


def _decode_varints(payload: np.ndarray) -> np.ndarray | None:
    """int64 values of back-to-back varints; None if one is unterminated or longer than 10 bytes."""
    ends = payload < 0x80
    if ends.all():
        return payload.astype(np.int64)
    if not ends[-1]:
        return None
    last = np.flatnonzero(ends)
    first = np.concatenate(([0], last[:-1] + 1))
    sizes = last - first + 1
    if sizes.max() > 10:
        return None
    shifts = (np.arange(payload.size) - np.repeat(first, sizes)).astype(np.uint64) * np.uint64(7)
    groups = (payload & 0x7F).astype(np.uint64) << shifts
    return np.bitwise_or.reduceat(groups, first).view(np.int64)


def _decode_packed(raws: list[bytes], kind: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Value counts and flat values of canonical packed int64/float Features, vectorised.

    Accepts only the layout protobuf writers produce (one oneof field holding
    one packed list, or an empty Feature); returns None for anything else so
    the general parser can decide.
    """
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    ends = np.cumsum(lengths)
    buf = np.frombuffer(b"".join(raws) + PAD, dtype=np.uint8)
    present = np.flatnonzero(lengths)
    starts, stops = ends[present] - lengths[present], ends[present]
    if (buf[starts] != _KIND_TAG[kind]).any():
        return None
    outer = read_varints(buf, starts + 1)
    if outer is None:
        return None
    list_starts = starts + 1 + outer[1]
    if (list_starts + outer[0] != stops).any():
        return None
    filled = outer[0] > 0
    list_starts, stops, holders = list_starts[filled], stops[filled], present[filled]
    if (buf[list_starts] != _LEN_TAG).any():
        return None
    inner = read_varints(buf, list_starts + 1)
    if inner is None:
        return None
    value_starts = list_starts + 1 + inner[1]
    if (value_starts + inner[0] != stops).any():
        return None
    raw_starts = ends - lengths
    header_ends = ends.copy()
    header_ends[holders] = value_starts
    keep = np.ones(buf.size - len(PAD), dtype=bool)
    keep[ragged_positions(raw_starts, header_ends - raw_starts)] = False
    payload = buf[:keep.size][keep]
    counts = np.zeros(len(raws), dtype=np.int64)
    if kind == "float":
        if (inner[0] % 4).any():
            return None
        counts[holders] = inner[0] // 4
        return counts, payload.view("<f4")
    ends_of_lists = np.cumsum(inner[0])[inner[0] > 0] - 1
    if (payload[ends_of_lists] >= 0x80).any():
        return None  # a varint runs past its list's end: malformed, let the parser say so
    values = _decode_varints(payload) if payload.size else np.zeros(0, dtype=np.int64)
    if values is None:
        return None
    counts[holders] = segment_sums((payload < 0x80).astype(np.int64), inner[0])
    return counts, values


def _decode_general(raws: list[bytes], kind: str) -> tuple[np.ndarray, list[Any]]:
    """Value counts and flat values via the protobuf parser: any valid encoding, exact errors."""
    field = KIND_FIELD[kind]
    counts = np.zeros(len(raws), dtype=np.int64)
    values: list[Any] = []
    for i, raw in enumerate(raws):
        feature = parse_feature(raw, i)
        found = feature.WhichOneof("kind")
        if found is None:
            continue
        if found != field:
            raise BadFeature(i, f"expected {field}, found {found}")
        held = getattr(feature, found).value
        counts[i] = len(held)
        values.extend(held)
    return counts, values


def _decode_features(raws: list[bytes], kind: str) -> tuple[np.ndarray, pa.Array]:
    """Per-Feature value counts and all values (int64, float32 or binary) of serialized Features.

    Many Features are decoded SLICE at a time, so the temporaries stay small however many
    tiny Features one column of one chunk holds.
    """
    if len(raws) > SLICE:
        parts = []
        for at in range(0, len(raws), SLICE):
            try:
                parts.append(_decode_features(raws[at:at + SLICE], kind))
            except BadFeature as bad:
                raise BadFeature(at + bad.index, bad.message, bad.corrupt) from None
        return np.concatenate([counts for counts, _ in parts]), pa.concat_arrays([values for _, values in parts])
    if kind != "bytes" and raws:
        packed = _decode_packed(raws, kind)
        if packed is not None:
            return packed[0], pa.array(packed[1])
    counts, values = _decode_general(raws, kind)
    return counts, pa.array(values, type=_KIND_ARROW[kind])


# --- one column, then the batch -------------------------------------------------------------------

@dataclass(frozen=True)
class _Where:
    """Names the file, record and column of a problem found while decoding one column (of `payloads`, records of
    `kind`)."""

    path: str | None
    first_record: int
    column: str
    payloads: Sequence[bytes]
    kind: str

    def steps(self, record: int, steps: Any) -> Any:
        """A feature list of local record `record`, once protobuf is known to have set none of it aside."""
        check_steps(steps, self.payloads[record], self.kind, self.path, self.first_record + record)
        return steps

    def fail(self, record: int, message: str, error: type[InputError] = InputError) -> NoReturn:
        """Raise error for local record index `record`."""
        raise error(f"{where(self.path, record=self.first_record + record, column=self.column)}: {message}")


@dataclass(frozen=True)
class _Gathered:
    """One column's serialized Features from a chunk: the records holding it and their Features."""

    records: np.ndarray  # local indices of the records that hold the feature
    raws: list[bytes]  # their Features, record after record
    per_record: np.ndarray  # Features per holding record
    stepwise: np.ndarray  # per holding record: its Features are feature-list steps, not one context Feature

    def fail_raw(self, loc: _Where, raw: int, message: str, error: type[InputError] = InputError) -> NoReturn:
        """Raise error naming the record (and feature-list step) of Feature number `raw`."""
        ends = np.cumsum(self.per_record)
        slot = int(np.searchsorted(ends, raw, side="right"))
        step = raw - int(ends[slot] - self.per_record[slot])
        where_in = f"feature list step {step}: " if self.stepwise[slot] else ""
        loc.fail(int(self.records[slot]), where_in + message, error)

    def fail_value(self, loc: _Where, counts: np.ndarray, value: int, message: str) -> NoReturn:
        """Raise InputError naming the record holding flat value number `value`."""
        self.fail_raw(loc, int(np.searchsorted(np.cumsum(counts), value, side="right")), message)


def _gather(name: str, depth: int, contexts: Sequence[Mapping[str, bytes]],
            feature_lists: Sequence[Mapping[str, Any]] | None, loc: _Where) -> _Gathered:
    """Collect a column's Features: scalars from context, nested lists from feature lists, lists from either."""
    records, raws, per_record, stepwise = [], [], [], []
    for i, context in enumerate(contexts):
        steps = feature_lists[i].get(name) if feature_lists is not None else None
        if steps is not None:
            if depth == 0:
                loc.fail(i, "is a feature list, but the schema has a scalar column (a context feature)")
            steps = loc.steps(i, steps).feature
            raws.extend(steps)
            per_record.append(len(steps))
            stepwise.append(True)
        else:
            raw = context.get(name)
            if raw is None:
                continue
            if depth == 2:
                loc.fail(i, "is a context feature, but the schema has a list-of-lists column (a feature list)")
            raws.append(raw)
            per_record.append(1)
            stepwise.append(False)
        records.append(i)
    return _Gathered(np.array(records, dtype=np.int64), raws, np.array(per_record, dtype=np.int64),
                     np.array(stepwise, dtype=bool))


def _first(mask: np.ndarray) -> int:
    """Index of the first True."""
    return int(np.argmax(mask))


def _convert_leaf(values: pa.Array, target: pa.DataType, fail: Callable[[int, str], NoReturn]) -> pa.Array:
    """Cast decoded int64/float32/binary values to the schema's leaf type, refusing lossy integer casts."""
    if values.type == target:
        return values
    if pa.types.is_integer(target) or pa.types.is_boolean(target):
        ints = values.to_numpy()
        if pa.types.is_boolean(target):
            bad = (ints != 0) & (ints != 1)
        else:
            info = np.iinfo(target.to_pandas_dtype())
            bad = (ints < max(info.min, INT64_MIN)) | (ints > min(info.max, INT64_MAX))
        if bad.any():
            i = _first(bad)
            fail(i, f"value {ints[i]} does not fit the schema type {target}")
        return pa.array(ints.astype(target.to_pandas_dtype()), type=target)
    if pa.types.is_floating(target):
        return pa.array(values.to_numpy().astype(target.to_pandas_dtype()), type=target)
    if pa.types.is_fixed_size_binary(target):
        sizes = pc.binary_length(values).to_numpy(zero_copy_only=False)
        bad = sizes != target.byte_width
        if bad.any():
            fail(_first(bad), f"value of {sizes[_first(bad)]} bytes; the schema type {target} holds "
                              f"{target.byte_width}")
    try:
        return values.cast(target)
    except pa.ArrowInvalid:
        for i, value in enumerate(values.to_pylist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                fail(i, f"value {value[:40]!r} is not valid UTF-8; the schema type is {target}")
        raise


def _list_array(t: pa.DataType, lengths: np.ndarray, values: pa.Array,
                fail: Callable[[int, str], NoReturn]) -> pa.Array:
    """Lists of the given lengths over values, of list type t (a fixed size must match every length)."""
    if pa.types.is_fixed_size_list(t):
        bad = lengths != t.list_size
        if bad.any():
            i = _first(bad)
            fail(i, f"has {lengths[i]} values, expected {t.list_size} (schema type {t})")
        return pa.FixedSizeListArray.from_arrays(values, type=t)
    offsets = exclusive_cumsum(lengths)
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, type=t)
    if offsets[-1] > np.iinfo(np.int32).max:
        raise InputError(f"{offsets[-1]} values in one chunk overflow {t}; decode fewer records at a time")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=t)


def _decode_column(field: pa.Field, shape: ColumnShape, contexts: Sequence[Mapping[str, bytes]],
                   feature_lists: Sequence[Mapping[str, Any]] | None, loc: _Where) -> pa.Array:
    """One column of the batch, decoded and cast to the schema field."""
    n = len(contexts)
    got = _gather(field.name, len(shape.lists), contexts, feature_lists, loc)
    try:
        counts, values = _decode_features(got.raws, shape.kind)
    except BadFeature as problem:
        got.fail_raw(loc, problem.index, problem.message, CorruptRecordError if problem.corrupt else InputError)

    def fail_value(i: int, message: str) -> NoReturn:
        got.fail_value(loc, counts, i, message)

    def fail_raw(i: int, message: str) -> NoReturn:
        got.fail_raw(loc, i, message)

    def fail_record(i: int, message: str) -> NoReturn:
        loc.fail(int(got.records[i]), message)

    leaf = _convert_leaf(values, shape.leaf, fail_value)
    if not shape.lists:
        bad = counts != 1
        if bad.any():
            fail_raw(_first(bad), f"expected exactly 1 value, found {counts[_first(bad)]} "
                                  f"(schema type {field.type})")
        array = leaf
    elif len(shape.lists) == 1:
        bad = np.repeat(got.stepwise, got.per_record) & (counts != 1)
        if bad.any():
            fail_raw(_first(bad), f"expected 1 value per step, found {counts[_first(bad)]} "
                                  f"(schema type {field.type})")
        array = _list_array(shape.lists[0], segment_sums(counts, got.per_record), leaf, fail_record)
    else:
        steps = _list_array(shape.lists[1], counts, leaf, fail_raw)
        array = _list_array(shape.lists[0], got.per_record, steps, fail_record)
    present = np.zeros(n, dtype=bool)
    present[got.records] = True
    if present.all():
        return array
    if not field.nullable:
        loc.fail(_first(~present), f"feature is missing and the schema field is not nullable ({field.type})")
    return array.take(pa.array(np.cumsum(present) - 1, mask=~present))


def decode_records(payloads: Sequence[bytes], schema: pa.Schema, kind: str, *, path: str,
                   first_record: int) -> pa.RecordBatch:
    """Decode serialized Examples or SequenceExamples into a batch of exactly `schema`.

    Only the schema's columns are read, so a projected schema is column
    projection. A scalar column is a context feature with one value; a list
    column is a feature list with one value per step if the record has one,
    else a context feature's values; a list-of-lists column is a feature list.
    Values are cast to the schema's types (integers only when they fit; a
    column of an extension type is decoded as its storage, then wrapped). A
    missing feature is null. Records that contradict the schema raise
    InputError, malformed ones CorruptRecordError, naming the file, the record
    (first_record + position) and the column.
    """
    check_kind(kind)
    stored = column_types.reading_schema(schema)  # a record holds an extension type's storage (see encode_records)
    if stored is not schema:
        decoded = decode_records(payloads, stored, kind, path=path, first_record=first_record)
        return column_types.conform_written(decoded, schema)
    shapes = [column_shape(field, kind) for field in schema]
    parsed = parse_records(payloads, path, first_record)
    check_records(parsed, payloads, kind, path, first_record)
    contexts = [message.context.feature for message in parsed]
    feature_lists = [message.feature_lists.feature_list for message in parsed] \
        if kind == "sequence_example" else None
    arrays = [_decode_column(field, shape, contexts, feature_lists,
                             _Where(path, first_record, field.name, payloads, kind))
              for field, shape in zip(schema, shapes)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema) if arrays else rows_only(len(payloads))
