"""tf.train.Example / tf.train.SequenceExample <-> Arrow record batches, without TensorFlow."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from itertools import pairwise
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from batchtool.errors import CorruptRecordError, InputError, SchemaError, UsageError, where
from batchtool.formats import wire
from batchtool.formats.wire import PAD, read_varints

KINDS = ("example", "sequence_example")

# --- protobuf messages, defined at import time in a private pool -----------------------------

_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, ftype: int, type_name: str = "", *, repeated: bool = False,
           packed: bool = False, oneof: int | None = None) -> descriptor_pb2.FieldDescriptorProto:
    """One field descriptor."""
    field = _F(name=name, number=number, type=ftype,
               label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name
    if packed:
        field.options.packed = True
    if oneof is not None:
        field.oneof_index = oneof
    return field


def _add_message(file: descriptor_pb2.FileDescriptorProto, name: str,
                 fields: Sequence[descriptor_pb2.FieldDescriptorProto] = ()) -> descriptor_pb2.DescriptorProto:
    """Add a message with the given fields to file."""
    message = file.message_type.add(name=name)
    message.field.extend(fields)
    return message


def _add_map(file: descriptor_pb2.FileDescriptorProto, message: descriptor_pb2.DescriptorProto,
             name: str, entry_name: str, value_type: int, value_type_name: str = "") -> None:
    """Add `map<string, value> name = 1` to message, as protoc would (a nested map-entry type)."""
    entry = message.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    entry.field.extend([_field("key", 1, _F.TYPE_STRING), _field("value", 2, value_type, value_type_name)])
    message.field.append(_field(name, 1, _F.TYPE_MESSAGE, f".{file.package}.{message.name}.{entry_name}",
                                repeated=True))


def _tensorflow_file() -> descriptor_pb2.FileDescriptorProto:
    """tensorflow/core/example/{feature,example}.proto, with TensorFlow's field numbers."""
    file = descriptor_pb2.FileDescriptorProto(name="batchtool/tensorflow_example.proto",
                                              package="tensorflow", syntax="proto3")
    _add_message(file, "BytesList", [_field("value", 1, _F.TYPE_BYTES, repeated=True)])
    _add_message(file, "FloatList", [_field("value", 1, _F.TYPE_FLOAT, repeated=True, packed=True)])
    _add_message(file, "Int64List", [_field("value", 1, _F.TYPE_INT64, repeated=True, packed=True)])
    feature = _add_message(file, "Feature", [
        _field("bytes_list", 1, _F.TYPE_MESSAGE, ".tensorflow.BytesList", oneof=0),
        _field("float_list", 2, _F.TYPE_MESSAGE, ".tensorflow.FloatList", oneof=0),
        _field("int64_list", 3, _F.TYPE_MESSAGE, ".tensorflow.Int64List", oneof=0)])
    feature.oneof_decl.add(name="kind")
    _add_map(file, _add_message(file, "Features"), "feature", "FeatureEntry", _F.TYPE_MESSAGE, ".tensorflow.Feature")
    _add_message(file, "FeatureList", [_field("feature", 1, _F.TYPE_MESSAGE, ".tensorflow.Feature", repeated=True)])
    _add_map(file, _add_message(file, "FeatureLists"), "feature_list", "FeatureListEntry", _F.TYPE_MESSAGE,
             ".tensorflow.FeatureList")
    _add_message(file, "Example", [_field("features", 1, _F.TYPE_MESSAGE, ".tensorflow.Features")])
    _add_message(file, "SequenceExample", [_field("context", 1, _F.TYPE_MESSAGE, ".tensorflow.Features"),
                                           _field("feature_lists", 2, _F.TYPE_MESSAGE, ".tensorflow.FeatureLists")])
    return file


def _view_file() -> descriptor_pb2.FileDescriptorProto:
    """Wire-compatible views of the same messages that keep every Feature as raw bytes.

    Parsing with these lets protobuf's C parser find each Feature (one per
    context feature, one per feature-list step) so their contents can be
    decoded in bulk with NumPy. An Example parses as a SequenceExample view
    whose context is the Example's features (both are field 1).
    """
    file = descriptor_pb2.FileDescriptorProto(name="batchtool/example_view.proto",
                                              package="batchtool.view", syntax="proto3")
    _add_map(file, _add_message(file, "FeaturesView"), "feature", "FeatureEntry", _F.TYPE_BYTES)
    _add_message(file, "FeatureListView", [_field("feature", 1, _F.TYPE_BYTES, repeated=True)])
    _add_map(file, _add_message(file, "FeatureListsView"), "feature_list", "FeatureListEntry", _F.TYPE_MESSAGE,
             ".batchtool.view.FeatureListView")
    _add_message(file, "SequenceExampleView", [
        _field("context", 1, _F.TYPE_MESSAGE, ".batchtool.view.FeaturesView"),
        _field("feature_lists", 2, _F.TYPE_MESSAGE, ".batchtool.view.FeatureListsView")])
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_tensorflow_file())
_POOL.Add(_view_file())


def _message_class(full_name: str) -> Any:
    """The generated class for one message of the private pool."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


BytesList = _message_class("tensorflow.BytesList")
FloatList = _message_class("tensorflow.FloatList")
Int64List = _message_class("tensorflow.Int64List")
Feature = _message_class("tensorflow.Feature")
Features = _message_class("tensorflow.Features")
FeatureList = _message_class("tensorflow.FeatureList")
FeatureLists = _message_class("tensorflow.FeatureLists")
Example = _message_class("tensorflow.Example")
SequenceExample = _message_class("tensorflow.SequenceExample")
_SequenceExampleView = _message_class("batchtool.view.SequenceExampleView")

# --- wire-format helpers ----------------------------------------------------------------------

# Feature's oneof: field number -> wire tag byte (length-delimited) and value kind.
_KIND_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}
_TAG_KIND = {bytes([tag]): kind for kind, tag in _KIND_TAG.items()}
_KIND_FIELD = {"bytes": "bytes_list", "float": "float_list", "int64": "int64_list"}
_FIELD_KIND = {field: kind for kind, field in _KIND_FIELD.items()}
_KIND_ARROW = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}
_LEN_TAG = 0x0A  # field 1, length-delimited: packed list, map entry, map key, repeated element
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


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """Start offset of each segment given segment lengths (int64, length n+1)."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _segment_sums(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sum of values over consecutive segments of the given lengths."""
    total = _exclusive_cumsum(values)
    bounds = _exclusive_cumsum(counts)
    return total[bounds[1:]] - total[bounds[:-1]]


def _ragged_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every position in the ranges [start, start + length), in order."""
    firsts = _exclusive_cumsum(lengths)
    return np.repeat(starts - firsts[:-1], lengths) + np.arange(firsts[-1])


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
    header_positions = _ragged_positions(_exclusive_cumsum(lengths)[:-1], header_sizes)
    body = np.ones(out.size, dtype=bool)
    body[header_positions] = False
    out[header_positions] = header_matrix[used]
    out[body] = flat
    return out, lengths


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


# --- decoding Features ------------------------------------------------------------------------

_SLICE = 1 << 18
"""Features walked or decoded at a time: bounds the temporaries of one column of one chunk."""

class _BadFeature(Exception):
    """A Feature that cannot be read as asked, by its position in the run being decoded."""

    def __init__(self, index: int, message: str, corrupt: bool = False) -> None:
        super().__init__(message)
        self.index = index
        self.message = message
        self.corrupt = corrupt


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
    keep[_ragged_positions(raw_starts, header_ends - raw_starts)] = False
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
    counts[holders] = _segment_sums((payload < 0x80).astype(np.int64), inner[0])
    return counts, values


def _parse_feature(raw: bytes, index: int) -> Any:
    """One Feature message; a parse failure names its position."""
    try:
        return Feature.FromString(raw)
    except DecodeError as exc:
        raise _BadFeature(index, f"malformed Feature protobuf ({exc})", corrupt=True) from None


def _decode_general(raws: list[bytes], kind: str) -> tuple[np.ndarray, list[Any]]:
    """Value counts and flat values via the protobuf parser: any valid encoding, exact errors."""
    field = _KIND_FIELD[kind]
    counts = np.zeros(len(raws), dtype=np.int64)
    values: list[Any] = []
    for i, raw in enumerate(raws):
        feature = _parse_feature(raw, i)
        found = feature.WhichOneof("kind")
        if found is None:
            continue
        if found != field:
            raise _BadFeature(i, f"expected {field}, found {found}")
        held = getattr(feature, found).value
        counts[i] = len(held)
        values.extend(held)
    return counts, values


def _decode_features(raws: list[bytes], kind: str) -> tuple[np.ndarray, pa.Array]:
    """Per-Feature value counts and all values (int64, float32 or binary) of serialized Features.

    Many Features are decoded _SLICE at a time, so the temporaries stay small however many
    tiny Features one column of one chunk holds.
    """
    if len(raws) > _SLICE:
        parts = []
        for at in range(0, len(raws), _SLICE):
            try:
                parts.append(_decode_features(raws[at:at + _SLICE], kind))
            except _BadFeature as bad:
                raise _BadFeature(at + bad.index, bad.message, bad.corrupt) from None
        return np.concatenate([counts for counts, _ in parts]), pa.concat_arrays([values for _, values in parts])
    if kind != "bytes" and raws:
        packed = _decode_packed(raws, kind)
        if packed is not None:
            return packed[0], pa.array(packed[1])
    counts, values = _decode_general(raws, kind)
    return counts, pa.array(values, type=_KIND_ARROW[kind])


# --- Arrow types --------------------------------------------------------------------------------

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_list(t: pa.DataType) -> bool:
    """List-like types a column may nest: list, large_list, fixed_size_list."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _leaf_kind(t: pa.DataType) -> str | None:
    """The Feature value kind that holds an Arrow leaf type, or None if none can."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_floating(t):
        return "float"
    if t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        return "bytes"
    return None


@dataclass(frozen=True)
class _Shape:
    """How a column's type nests: its list types (outermost first) and its leaf type and kind."""

    lists: tuple[pa.DataType, ...]
    leaf: pa.DataType
    kind: str


def _shape(field: pa.Field, kind: str) -> _Shape:
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
                          f"{kind}; expected {allowed} of integers, bools, floats, strings or binary")
    return _Shape(tuple(lists), t, leaf_kind)


def _check_kind(kind: str) -> None:
    """Reject a kind other than 'example' or 'sequence_example'."""
    if kind not in KINDS:
        raise UsageError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")


# --- decoding -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Where:
    """Names the file, record and column of a problem found while decoding one column."""

    path: str | None
    first_record: int
    column: str

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
            steps = steps.feature
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
            bad = (ints < max(info.min, _INT64_MIN)) | (ints > min(info.max, _INT64_MAX))
        if bad.any():
            i = _first(bad)
            fail(i, f"value {ints[i]} does not fit the schema type {target}")
        return pa.array(ints.astype(target.to_pandas_dtype()), type=target)
    if pa.types.is_floating(target):
        return pa.array(values.to_numpy().astype(target.to_pandas_dtype()), type=target)
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
    offsets = _exclusive_cumsum(lengths)
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, type=t)
    if offsets[-1] > np.iinfo(np.int32).max:
        raise InputError(f"{offsets[-1]} values in one chunk overflow {t}; decode fewer records at a time")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=t)


def _decode_column(field: pa.Field, shape: _Shape, contexts: Sequence[Mapping[str, bytes]],
                   feature_lists: Sequence[Mapping[str, Any]] | None, loc: _Where) -> pa.Array:
    """One column of the batch, decoded and cast to the schema field."""
    n = len(contexts)
    got = _gather(field.name, len(shape.lists), contexts, feature_lists, loc)
    try:
        counts, values = _decode_features(got.raws, shape.kind)
    except _BadFeature as problem:
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
        array = _list_array(shape.lists[0], _segment_sums(counts, got.per_record), leaf, fail_record)
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


def _parse_records(payloads: Sequence[bytes], path: str | None, first_record: int,
                   message: Any = _SequenceExampleView) -> list[Any]:
    """Parse payloads as SequenceExample views (an Example's features land in context), or as `message`."""
    parsed = []
    for i, payload in enumerate(payloads):
        try:
            parsed.append(message.FromString(payload))
        except DecodeError as exc:
            raise CorruptRecordError(f"{where(path, record=first_record + i)}: malformed Example/"
                                     f"SequenceExample protobuf ({exc})") from None
    return parsed


def decode_records(payloads: Sequence[bytes], schema: pa.Schema, kind: str, *, path: str,
                   first_record: int) -> pa.RecordBatch:
    """Decode serialized Examples or SequenceExamples into a batch of exactly `schema`.

    Only the schema's columns are read, so a projected schema is column
    projection. A scalar column is a context feature with one value; a list
    column is a feature list with one value per step if the record has one,
    else a context feature's values; a list-of-lists column is a feature list.
    Values are cast to the schema's types (integers only when they fit). A
    missing feature is null. Records that contradict the schema raise
    InputError, malformed ones CorruptRecordError, naming the file, the record
    (first_record + position) and the column.
    """
    _check_kind(kind)
    shapes = [_shape(field, kind) for field in schema]
    parsed = _parse_records(payloads, path, first_record)
    contexts = [message.context.feature for message in parsed]
    feature_lists = [message.feature_lists.feature_list for message in parsed] \
        if kind == "sequence_example" else None
    arrays = [_decode_column(field, shape, contexts, feature_lists, _Where(path, first_record, field.name))
              for field, shape in zip(schema, shapes)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --- schema inference: one pass over every record's feature names, kinds and value counts --------

MAX_FEATURES = 10_000
"""Distinct feature names (columns) an input may have: each costs memory and time in every chunk
decoded, so a record of many tiny features must not turn its bytes into columns."""

_ONEOF_KINDS = (None, "bytes", "float", "int64")
"""Feature's oneof field number -> value kind (0: no kind set)."""

Place = tuple[str | None, int]
"""(file, record index): where something was first seen, for error messages."""


@dataclass(frozen=True)
class _Occurrences:
    """What a run of records holds, Feature by Feature, without the values themselves.

    A Feature is a context feature or one step of a feature list; records are local indices.
    """

    names: list[str]
    record: np.ndarray  # per Feature
    name: np.ndarray  # per Feature: index into names
    step: np.ndarray  # per Feature: a feature-list step (else a context feature)
    kind: np.ndarray  # per Feature: oneof field number, 0 when no kind is set
    count: np.ndarray  # per Feature: values it holds
    list_record: np.ndarray  # per feature list (steps or not)
    list_name: np.ndarray
    not_utf8: frozenset[int]  # names with a bytes value that is not UTF-8
    sequence: bool  # some record has the feature_lists field


def _entries(buf: np.ndarray, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """The map entries of Features/FeatureLists messages: (owner, key start, key end, value start, value end).

    Every entry must be exactly key then value, as protobuf writes them; else Unusual.
    """
    holder, entry_start, entry_end = wire.items(buf, starts, ends)
    _, key_start, key_end = wire.field_at(buf, entry_start, 0x0A)
    if (key_end >= entry_end).any():
        raise wire.Unusual
    _, value_start, value_end = wire.field_at(buf, key_end, 0x12)
    if (value_end != entry_end).any():
        raise wire.Unusual
    return owner[holder], key_start, key_end, value_start, value_end


def _strings(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.LargeBinaryArray:
    """The (disjoint) byte ranges of buf as a binary array in their order, gathered by Arrow: no per-byte indices.

    The ranges, sorted, and the gaps between them are the values of one array over buf; taking
    every other value is the gather.
    """
    order = np.argsort(starts, kind="stable")
    bounds = np.empty(2 * starts.size + 1, dtype=np.int64)
    bounds[0:-1:2], bounds[1::2] = starts[order], ends[order]
    bounds[-1] = bounds[-2] if starts.size else 0
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * starts.size,
                                             [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return spans.take(pa.array(2 * rank))


def _terminators(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Varints in each range (packed int64 values): its bytes below 0x80, each of which ends one."""
    size = ends - starts
    longest = int(size.max(initial=0))
    if longest <= len(PAD):  # a few values each: look at their bytes directly
        counts = np.zeros(starts.size, dtype=np.int64)
        for j in range(longest):
            counts += (j < size) & (buf[starts + j] < 0x80)
        return counts
    packed = _strings(buf, starts, ends)
    _, offsets, data = packed.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[:len(packed) + 1]
    data = np.frombuffer(data, dtype=np.uint8)[:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    running = np.zeros(data.size + 1, dtype=np.int32 if data.size < 1 << 31 else np.int64)
    np.cumsum(data < 0x80, out=running[1:])
    return (running[offsets[1:]] - running[offsets[:-1]]).astype(np.int64)


def _not_utf8(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: np.ndarray) -> frozenset[int]:
    """The names among these bytes values' names that have a value that is not valid UTF-8 (_SLICE values at a time)."""
    bad: set[int] = set()
    for at in range(0, starts.size, _SLICE):
        values, part_names = _strings(buf, starts[at:at + _SLICE], ends[at:at + _SLICE]), names[at:at + _SLICE]
        try:
            values.cast(pa.large_string())
            continue
        except pa.ArrowInvalid:
            pass
        for name in set(np.unique(part_names).tolist()) - bad:
            try:
                values.filter(pa.array(part_names == name)).cast(pa.large_string())
            except pa.ArrowInvalid:
                bad.add(name)
    return frozenset(bad)


def _kinds_and_counts(buf: np.ndarray, starts: np.ndarray,
                      ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Each Feature's oneof field number (0: none) and value count, and (Feature, start, end) of its bytes values.

    Packed lists must be one field, as protobuf writes them; else Unusual. Many Features are
    walked _SLICE at a time, so the temporaries stay small.
    """
    if starts.size > _SLICE:
        parts = [(at, _kinds_and_counts(buf, starts[at:at + _SLICE], ends[at:at + _SLICE]))
                 for at in range(0, starts.size, _SLICE)]
        texts = tuple(np.concatenate([part[2][i] + (at if i == 0 else 0) for at, part in parts]) for i in range(3))
        return (np.concatenate([part[0] for _, part in parts]), np.concatenate([part[1] for _, part in parts]),
                texts)
    kinds = np.zeros(starts.size, dtype=np.int64)
    counts = np.zeros(starts.size, dtype=np.int64)
    present = np.flatnonzero(ends > starts)
    tags, list_start, list_end = wire.field_at(buf, starts[present], None)
    code = (tags >> 3).astype(np.int64)
    if (list_end != ends[present]).any() or (code > 3).any():
        raise wire.Unusual  # a second field, or not a value list
    kinds[present] = code
    packed = np.flatnonzero((code >= 2) & (list_end > list_start))
    _, value_start, value_end = wire.field_at(buf, list_start[packed], 0x0A)
    if (value_end != list_end[packed]).any():
        raise wire.Unusual
    size = value_end - value_start
    floats = code[packed] == 2
    if (size[floats] % 4).any():
        raise wire.Unusual
    ints = np.flatnonzero(~floats & (size > 0))
    if (buf[value_end[ints] - 1] >= 0x80).any():
        raise wire.Unusual  # a varint runs past its list's end
    counts[present[packed[floats]]] = size[floats] // 4
    counts[present[packed[ints]]] = _terminators(buf, value_start[ints], value_end[ints])
    texts = present[code == 1]
    owner, text_start, text_end = wire.items(buf, list_start[code == 1], list_end[code == 1])
    counts[texts] = np.bincount(owner, minlength=texts.size)
    return kinds, counts, (texts[owner], text_start, text_end)


def _occurrences_fast(payloads: Sequence[bytes], kind: str) -> _Occurrences:
    """_Occurrences by walking the wire format with NumPy; wire.Unusual for anything but plain protobuf output."""
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    buf = np.frombuffer(b"".join(payloads) + PAD, dtype=np.uint8)
    ends = np.cumsum(lengths)
    top = wire.fields(buf, ends - lengths, ends)
    holders = [top.numbered(1), top.numbered(2) if kind != "example" else top.take(top.number < 0)]
    context, lists = (_entries(buf, h.owner, h.start, h.end) for h in holders)
    keys = _strings(buf, np.concatenate([context[1], lists[1]]), np.concatenate([context[2], lists[2]]))
    encoded = keys.dictionary_encode()
    try:
        names = encoded.dictionary.cast(pa.large_string()).to_pylist()
    except pa.ArrowInvalid:
        raise wire.Unusual from None  # a key that is not UTF-8: protobuf says what is wrong
    ids = encoded.indices.to_numpy().astype(np.int64)
    context_names, list_names = ids[:context[0].size], ids[context[0].size:]
    for records, name_ids in ((context[0], context_names), (lists[0], list_names)):
        pairs = records * len(names) + name_ids
        if np.unique(pairs).size != pairs.size:
            raise wire.Unusual  # a repeated map key: the last one wins, as protobuf decides
    step_owner, step_start, step_end = wire.items(buf, lists[3], lists[4])
    kinds, counts, (texts, text_start, text_end) = _kinds_and_counts(
        buf, np.concatenate([context[3], step_start]), np.concatenate([context[4], step_end]))
    name = np.concatenate([context_names, list_names[step_owner]])
    return _Occurrences(names, np.concatenate([context[0], lists[0][step_owner]]), name,
                        np.arange(name.size) >= context[0].size, kinds, counts, lists[0], list_names,
                        _not_utf8(buf, text_start, text_end, name[texts]), bool(holders[1].owner.size))


def _occurrences_parsed(payloads: Sequence[bytes], kind: str, path: str | None, first_record: int) -> _Occurrences:
    """_Occurrences by protobuf's parser, one Feature at a time: any valid encoding, and the exact error otherwise.

    The records are parsed as the full messages first, as TensorFlow's parser would: the views
    do not look inside what protobuf sets aside (a map entry with an unknown field), the full
    messages do, so a record TensorFlow rejects is rejected here too.
    """
    _parse_records(payloads, path, first_record, Example if kind == "example" else SequenceExample)
    index: dict[str, int] = {}
    features: list[tuple[int, int, bool, bytes]] = []
    lists: list[tuple[int, int]] = []
    sequence = False
    for i, message in enumerate(_parse_records(payloads, path, first_record)):
        features += [(i, index.setdefault(name, len(index)), False, raw)
                     for name, raw in message.context.feature.items()]
        if kind != "example" and message.HasField("feature_lists"):
            sequence = True
            for name, steps in message.feature_lists.feature_list.items():
                lists.append((i, index.setdefault(name, len(index))))
                features += [(i, lists[-1][1], True, raw) for raw in steps.feature]
    names = list(index)
    kinds, counts, not_utf8 = [], [], set()
    for record, name, _, raw in features:
        try:
            feature = _parse_feature(raw, 0)
        except _BadFeature as bad:
            raise CorruptRecordError(f"{where(path, record=first_record + record, column=names[name])}: "
                                     f"{bad.message}") from None
        found = feature.WhichOneof("kind")
        values = getattr(feature, found).value if found else ()
        kinds.append(_ONEOF_KINDS.index(_FIELD_KIND[found]) if found else 0)
        counts.append(len(values))
        if found == "bytes_list" and name not in not_utf8:
            try:
                for value in values:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                not_utf8.add(name)

    def column(position: int, rows: list[tuple]) -> np.ndarray:
        return np.array([row[position] for row in rows], dtype=np.int64)

    return _Occurrences(names, column(0, features), column(1, features), column(2, features).astype(bool),
                        np.array(kinds, dtype=np.int64), np.array(counts, dtype=np.int64), column(0, lists),
                        column(1, lists), frozenset(not_utf8), sequence)


def _too_many(count: int, at: Place) -> InputError:
    """More distinct feature names than MAX_FEATURES, the last ones first seen at `at`."""
    return InputError(f"{where(at[0], record=at[1])}: {count:,} distinct feature names, more than the "
                      f"{MAX_FEATURES:,} columns batchtool reads")


def _kind_conflict(name: str, kind: str, at: Place, first_kind: str, first_at: Place) -> InputError:
    """A feature holding `kind` at `at` after holding `first_kind` from `first_at` on."""
    first = where(first_at[0], record=first_at[1])
    return InputError(f"{where(at[0], record=at[1], column=name)}: holds {_KIND_FIELD[kind]}, but earlier values "
                      f"of this feature are {_KIND_FIELD[first_kind]} (first at {first}); one column holds one type")


@dataclass(frozen=True)
class _FeatureSeen:
    """What the schema pass learned about one feature: enough to choose its column type."""

    in_list: bool
    first: Place
    kind: str | None
    kind_first: Place | None
    width: int | None
    """Values per Feature: None if it has no Feature, w if every one holds w, -1 if they differ."""
    utf8: bool

    def merge(self, later: _FeatureSeen, name: str) -> _FeatureSeen:
        """This feature seen in earlier records and then in `later` ones; an error where they contradict."""
        if later.in_list != self.in_list:
            role = ("a feature list has the name of a context feature" if later.in_list
                    else "a context feature has the name of a feature list")
            raise SchemaError(f"{where(later.first[0], record=later.first[1], column=name)}: {role} (first seen "
                              f"at {where(self.first[0], record=self.first[1])}); one column cannot hold both")
        if self.kind and later.kind and later.kind != self.kind:
            raise _kind_conflict(name, later.kind, later.kind_first, self.kind, self.kind_first)
        width = later.width if self.width is None else self.width if later.width in (None, self.width) else -1
        return _FeatureSeen(self.in_list, self.first, self.kind or later.kind, self.kind_first or later.kind_first,
                            width, self.utf8 and later.utf8)

    def arrow_type(self) -> pa.DataType:
        """The column type: see infer_schema."""
        leaf = {None: pa.int64(), "int64": pa.int64(), "float": pa.float32()}.get(
            self.kind, pa.string() if self.utf8 else pa.binary())
        if not self.in_list:
            return leaf if self.width == 1 else pa.list_(leaf)
        if self.width in (None, 1):
            return pa.list_(leaf)
        return pa.list_(pa.list_(leaf, self.width)) if self.width > 1 else pa.list_(pa.list_(leaf))


def _seen(o: _Occurrences, path: str | None, first_record: int) -> dict[str, _FeatureSeen]:
    """Each feature's _FeatureSeen over one run of records; an error where the records contradict each other.

    Per-name minima and maxima by scattering (no sorting): a run can hold millions of Features.
    """
    n, never = len(o.names), np.iinfo(np.int64).max
    first = np.full(n, never)
    np.minimum.at(first, o.name, o.record)
    np.minimum.at(first, o.list_name, o.list_record)
    if n > MAX_FEATURES:
        raise _too_many(n, (path, first_record + int(np.sort(first)[MAX_FEATURES])))
    first_list = np.full(n, never)
    np.minimum.at(first_list, o.list_name, o.list_record)
    in_context = np.zeros(n, dtype=bool)
    in_context[o.name[~o.step]] = True
    clash = np.flatnonzero(in_context & (first_list < never))
    if clash.size:
        i = min(clash.tolist(), key=lambda c: (first_list[c], o.names[c]))  # the first in the records
        raise SchemaError(f"{where(path, record=first_record + int(first_list[i]), column=o.names[i])}: a feature "
                          "list has the name of a context feature; one column cannot hold both")
    kind_first = np.full((n, len(_ONEOF_KINDS)), never)
    np.minimum.at(kind_first, (o.name, o.kind), o.record)
    kind_first[:, 0] = never  # no kind set: no constraint
    smallest = np.full(n, never)
    np.minimum.at(smallest, o.name, o.count)
    largest = np.full(n, -1)
    np.maximum.at(largest, o.name, o.count)
    out: dict[str, _FeatureSeen] = {}
    conflicts = []
    for i, name in enumerate(o.names):
        held = np.flatnonzero(kind_first[i] < never)
        kind, kind_first_at = None, None
        if held.size:
            code = int(held[np.argmin(kind_first[i, held])])
            kind, kind_first_at = _ONEOF_KINDS[code], (path, first_record + int(kind_first[i, code]))
            for other in held[held != code].tolist():
                at = (path, first_record + int(kind_first[i, other]))
                conflicts.append((at[1], name, _kind_conflict(name, _ONEOF_KINDS[other], at, kind, kind_first_at)))
        width = None if largest[i] < 0 else int(largest[i]) if largest[i] == smallest[i] else -1
        out[name] = _FeatureSeen(bool(first_list[i] < never), (path, first_record + int(first[i])), kind,
                                 kind_first_at, width, i not in o.not_utf8)
    if conflicts:
        raise min(conflicts, key=lambda c: c[:2])[2]  # the first in the records
    return out


@dataclass(frozen=True)
class FeatureScan:
    """Feature names, kinds and value counts of every record read so far: what a TFRecord schema is built from.

    Built a chunk at a time (scan_records) and merged in file order, so a feature first seen
    in the last record counts as much as one in the first.
    """

    records: int = 0
    sequence: bool = False
    features: Mapping[str, _FeatureSeen] = dataclass_field(default_factory=dict)

    def merge(self, later: FeatureScan) -> FeatureScan:
        """This scan followed by a scan of later records."""
        features = dict(self.features)
        for name, seen in later.features.items():
            features[name] = features[name].merge(seen, name) if name in features else seen
        if len(features) > MAX_FEATURES:
            raise _too_many(len(features), min((s.first for n, s in later.features.items() if n not in self.features),
                                               key=lambda place: place[1]))
        return FeatureScan(self.records + later.records, self.sequence or later.sequence, features)

    def schema(self, kind: str = "auto", source: str | None = None) -> tuple[pa.Schema, str]:
        """The Arrow schema and record kind (see infer_schema); InputError if no record has any feature."""
        if kind == "auto":
            kind = "sequence_example" if self.sequence else "example"
        _check_kind(kind)
        if not self.records:
            raise InputError(f"{where(source)}: no records to infer a schema from")
        names = sorted(self.features, key=lambda n: (self.features[n].in_list, n))
        if not names:
            raise InputError(f"{where(source)}: no features in {self.records:,} records, so there are no columns "
                             "to read (every record is an empty Example)")
        return pa.schema([pa.field(n, self.features[n].arrow_type()) for n in names]), kind


def scan_records(payloads: Sequence[bytes], kind: str = "auto", *, path: str | None = None,
                 first_record: int = 0) -> FeatureScan:
    """The FeatureScan of serialized records: their feature names, kinds and value counts, not their values.

    Walks the wire format with NumPy (wire.fields), many records at once; records written
    some other way than protobuf writes them are parsed with protobuf instead, which also
    names the record of a malformed one (CorruptRecordError).
    """
    if kind != "auto":
        _check_kind(kind)
    try:
        occurrences = _occurrences_fast(payloads, kind)
    except wire.Unusual:
        occurrences = _occurrences_parsed(payloads, kind, path, first_record)
    return FeatureScan(len(payloads), occurrences.sequence, _seen(occurrences, path, first_record))


def infer_schema(payloads: Sequence[bytes], kind: str = "auto", *, path: str | None = None,
                 first_record: int = 0) -> tuple[pa.Schema, str]:
    """The Arrow schema of serialized records, and their kind, from every one of them.

    kind="auto": "sequence_example" if any record has the feature_lists field
    (field 2, which an Example never has), else "example". A SequenceExample
    without feature lists decodes the same either way. Columns: context
    features (sorted by name), then feature lists (sorted). A context feature
    with exactly one value wherever present is a scalar, else a list; a feature
    list is list<T> if every step has one value, list<fixed_size_list<T, D>> if
    every step has D > 1, else list<list<T>>. int64_list -> int64, float_list ->
    float32, bytes_list -> string if every value is UTF-8, else binary; a feature
    that never holds a value kind -> int64. A feature missing from a record is
    null there. Records that disagree on a feature's kind, or use one name for a
    context feature and a feature list, are an error naming the record.
    """
    return scan_records(payloads, kind, path=path, first_record=first_record).schema(kind, path)


# --- encoding ---------------------------------------------------------------------------------------

def _first_row(column: pa.Array, depth: int, predicate: Callable[[Any], bool]) -> int:
    """The first row holding a leaf (or inner list) for which predicate is true; for error messages."""
    def leaves(value: Any, level: int) -> list[Any]:
        if level == 0 or value is None:
            return [value]
        return [leaf for item in value for leaf in leaves(item, level - 1)]
    return next(row for row, value in enumerate(column.to_pylist())
                if value is not None and any(map(predicate, leaves(value, depth))))


def _int_payload(leaf: pa.Array, fail: Callable[[Callable[[Any], bool], str], NoReturn]) -> np.ndarray:
    """Integer/bool values as the uint64 bit patterns of their int64 Feature values."""
    if pa.types.is_boolean(leaf.type):
        return leaf.to_numpy(zero_copy_only=False).astype(np.uint64)
    ints = leaf.to_numpy()
    if ints.dtype == np.uint64 and (ints > _INT64_MAX).any():
        fail(lambda v: v > _INT64_MAX, f"a value exceeds the int64 range of tf.train.Int64List ({leaf.type})")
    return ints.astype(np.int64).view(np.uint64)


def _bytes_payload(leaf: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated bytes of string/binary values and each value's length."""
    leaf = leaf.cast(pa.large_binary())
    _, offsets_buffer, data_buffer = leaf.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[leaf.offset:leaf.offset + len(leaf) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return data[offsets[0]:offsets[-1]], np.diff(offsets)


def _encode_features(leaf: pa.Array, counts: np.ndarray, kind: str, outer: Sequence[tuple[bytes, bool]],
                     fail: Callable[[Callable[[Any], bool], str], NoReturn]) -> tuple[np.ndarray, np.ndarray]:
    """Serialized Features (then wrapped in `outer` layers), one per count, over the flat leaf values."""
    if kind == "int64":
        payload, sizes = _encode_varints(_int_payload(leaf, fail))
        return _wrap(payload, _segment_sums(sizes, counts), [(b"\x0a", True), (b"\x1a", False), *outer])
    if kind == "float":
        payload = np.ascontiguousarray(leaf.to_numpy(zero_copy_only=False), dtype="<f4").view(np.uint8)
        return _wrap(payload, counts * 4, [(b"\x0a", True), (b"\x12", False), *outer])
    data, lengths = _bytes_payload(leaf)
    values, sizes = _wrap(data, lengths, [(b"\x0a", False)])
    return _wrap(values, _segment_sums(sizes, counts), [(b"\x0a", False), *outer])


def _lengths(column: pa.Array) -> np.ndarray:
    """Lengths of the non-null lists of a list column."""
    return pc.list_value_length(column).drop_null().to_numpy().astype(np.int64)


def _split(flat: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> list[bytes]:
    """Cut flat into one bytes object per valid row; b"" for null rows."""
    data = flat.tobytes()
    bounds = _exclusive_cumsum(lengths).tolist()
    pieces = [data[a:b] for a, b in pairwise(bounds)]
    if valid.all():
        return pieces
    out = [b""] * len(valid)
    for row, piece in zip(np.flatnonzero(valid).tolist(), pieces):
        out[row] = piece
    return out


def _encode_column(name: str, column: pa.Array, shape: _Shape, as_feature_list: bool) -> list[bytes]:
    """Each row's serialized map entry (key, Feature or FeatureList) for one column; b"" where null."""
    depth = len(shape.lists)

    def fail(predicate: Callable[[Any], bool], message: str, level: int = depth) -> NoReturn:
        raise InputError(f"{where(row=_first_row(column, level, predicate), column=name)}: {message}")

    key = name.encode("utf-8")
    entry = [(b"\x0a" + _varint(len(key)) + key + b"\x12", False), (b"\x0a", False)]
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    leaf = column.filter(valid) if depth == 0 else pc.list_flatten(column)
    if depth == 2:
        if leaf.null_count:
            fail(lambda v: v is None, "a feature-list step is null; steps must be lists (empty for no values)", 1)
        counts, leaf = _lengths(leaf), pc.list_flatten(leaf)
    else:
        counts = _lengths(column) if depth == 1 and not as_feature_list else np.ones(len(leaf), dtype=np.int64)
    if leaf.null_count:
        fail(lambda v: v is None, "a value inside a list is null; tf.train.Feature cannot hold nulls")
    if not as_feature_list:
        flat, lengths = _encode_features(leaf, counts, shape.kind, entry, fail)
    else:
        flat, lengths = _encode_features(leaf, counts, shape.kind, [(b"\x0a", False)], fail)
        flat, lengths = _wrap(flat, _segment_sums(lengths, _lengths(column)), entry)
    return _split(flat, lengths, valid)


def _plan(field: pa.Field, kind: str, sequence_columns: Collection[str] | None) -> tuple[_Shape, bool]:
    """A column's shape and whether it becomes a feature list (else a context feature)."""
    shape = _shape(field, kind)
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
    _check_kind(kind)
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
    context: list[list[bytes]] = []
    lists: list[list[bytes]] = []
    for field, column in sorted(zip(batch.schema, batch.columns), key=lambda pair: pair[0].name.encode("utf-8")):
        shape, as_feature_list = _plan(field, kind, sequence_columns)
        if pa.types.is_float64(shape.leaf):
            raise SchemaError(f"{where(column=field.name)}: {field.type} cannot be stored exactly in a "
                              "tf.train.FloatList, which holds float32; cast the column to float32 first")
        (lists if as_feature_list else context).append(_encode_column(field.name, column, shape, as_feature_list))
    rows = batch.num_rows
    context_rows = [b"".join(parts) for parts in zip(*context)] if context else [b""] * rows
    list_rows = [b"".join(parts) for parts in zip(*lists)] if lists else [b""] * rows
    return [_message(b"\x0a", c) + _message(b"\x12", f) for c, f in zip(context_rows, list_rows)]
