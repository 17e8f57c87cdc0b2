"""tf.train.Example / SequenceExample <-> Arrow: inference, decoding to a schema, errors, encoding."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import LEAVES, SHAPES, record_batches

from batchtool.core.errors import CorruptRecordError, InputError, SchemaError, UsageError
from batchtool.io.formats.example import (
    Example,
    Feature,
    SequenceExample,
    decode_records,
    encode_records,
    infer_schema,
    scan_records,
)
from batchtool.io.formats.example.scan import _occurrences_fast, _occurrences_parsed, _seen

PATH = "shard-00001.tfrecord"


# --- building records ---------------------------------------------------------------------------

def feature(kind: str, values: list[Any]) -> Any:
    """A Feature of the given kind ('int64', 'float', 'bytes'); the kind is set even for no values."""
    out = Feature()
    target = {"int64": out.int64_list, "float": out.float_list, "bytes": out.bytes_list}[kind]
    target.SetInParent()
    target.value.extend(v.encode() if isinstance(v, str) else int(v) if isinstance(v, bool) else v
                        for v in values)
    return out


def ints(*values: int) -> Any:
    return feature("int64", list(values))


def floats(*values: float) -> Any:
    return feature("float", list(values))


def strs(*values: str | bytes) -> Any:
    return feature("bytes", list(values))


def seq(context: dict[str, Any] | None = None, lists: dict[str, list[Any]] | None = None) -> bytes:
    """A serialized SequenceExample from Feature messages."""
    message = SequenceExample()
    for name, value in (context or {}).items():
        message.context.feature[name].CopyFrom(value)
    for name, steps in (lists or {}).items():
        message.feature_lists.feature_list[name].feature.extend(steps)
    return message.SerializeToString(deterministic=True)


def ex(features: dict[str, Any]) -> bytes:
    """A serialized Example from Feature messages."""
    message = Example()
    for name, value in features.items():
        message.features.feature[name].CopyFrom(value)
    return message.SerializeToString(deterministic=True)


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def ld(tag: int, body: bytes) -> bytes:
    """A length-delimited field."""
    return bytes([tag]) + varint(len(body)) + body


def raw_seq(context: dict[str, bytes], lists: dict[str, list[bytes]] | None = None) -> bytes:
    """A SequenceExample written by hand from serialized Features, for encodings protobuf never emits."""
    def entry(key: str, value: bytes) -> bytes:
        return ld(0x0A, ld(0x0A, key.encode()) + ld(0x12, value))
    body = b"".join(entry(k, v) for k, v in context.items())
    lists_body = b"".join(entry(k, b"".join(ld(0x0A, s) for s in steps)) for k, steps in (lists or {}).items())
    return (ld(0x0A, body) if context else b"") + (ld(0x12, lists_body) if lists else b"")


def decode(payloads: list[bytes], schema: pa.Schema, kind: str = "sequence_example",
           first_record: int = 0) -> dict[str, list[Any]]:
    return decode_records(payloads, schema, kind, path=PATH, first_record=first_record).to_pydict()


def schema_of(payloads: list[bytes], kind: str = "auto") -> tuple[dict[str, str], str]:
    schema, detected = infer_schema(payloads, kind, path=PATH)
    return {f.name: str(f.type) for f in schema}, detected


def error(exc_type: type[Exception], payloads: list[bytes], schema: pa.Schema,
          kind: str = "sequence_example", first_record: int = 10) -> str:
    with pytest.raises(exc_type) as info:
        decode_records(payloads, schema, kind, path=PATH, first_record=first_record)
    message = str(info.value)
    assert "\n" not in message and message.startswith(PATH)
    return message


# --- inference ----------------------------------------------------------------------------------

def test_context_feature_with_one_value_everywhere_is_a_scalar() -> None:
    payloads = [seq({"id": ints(1)}), seq({"id": ints(2)}), seq({})]
    assert schema_of(payloads) == ({"id": "int64"}, "example")
    schema, _ = infer_schema(payloads)
    assert decode(payloads, schema, "example") == {"id": [1, 2, None]}


def test_context_feature_with_other_counts_is_a_list() -> None:
    assert schema_of([seq({"x": ints(1)}), seq({"x": ints(1, 2)})])[0] == {"x": "list<item: int64>"}
    assert schema_of([seq({"x": ints(1)}), seq({"x": ints()})])[0] == {"x": "list<item: int64>"}


def test_value_kinds_map_to_arrow_types() -> None:
    payloads = [ex({"f": floats(0.5), "s": strs("é"), "b": strs(b"\xff\x00"), "i": ints(-3)})]
    assert schema_of(payloads) == ({"b": "binary", "f": "float", "i": "int64", "s": "string"}, "example")


def test_bytes_feature_is_binary_if_any_value_is_not_utf8() -> None:
    assert schema_of([ex({"b": strs("ok")}), ex({"b": strs(b"\xc3")})])[0] == {"b": "binary"}


def test_feature_list_with_one_value_per_step() -> None:
    payloads = [seq(lists={"tok": [ints(1), ints(2)]}), seq(lists={"tok": []})]
    assert schema_of(payloads) == ({"tok": "list<item: int64>"}, "sequence_example")


def test_feature_list_with_d_values_per_step_is_fixed_size() -> None:
    payloads = [seq(lists={"v": [floats(1, 2, 3), floats(4, 5, 6)]}), seq(lists={"v": [floats(7, 8, 9)]})]
    assert schema_of(payloads)[0] == {"v": "list<item: fixed_size_list<item: float>[3]>"}


def test_ragged_feature_list_is_list_of_lists() -> None:
    payloads = [seq(lists={"w": [strs("a"), strs("b", "c"), strs()]})]
    assert schema_of(payloads)[0] == {"w": "list<item: list<item: string>>"}
    assert schema_of([seq(lists={"z": [ints(), ints()]})])[0] == {"z": "list<item: list<item: int64>>"}


def test_features_without_a_kind_are_int64() -> None:
    payloads = [seq({"c": Feature()}, {"l": [Feature()]})]
    assert schema_of(payloads)[0] == {"c": "list<item: int64>", "l": "list<item: list<item: int64>>"}


def test_columns_are_context_then_feature_lists_each_sorted() -> None:
    payloads = [seq({"b": ints(1), "a": ints(1)}, {"z": [ints(1)], "c": [ints(1)]})]
    schema, kind = infer_schema(payloads)
    assert schema.names == ["a", "b", "c", "z"] and kind == "sequence_example"


def test_kind_detection() -> None:
    assert schema_of([ex({"a": ints(1)})])[1] == "example"
    assert schema_of([seq({"a": ints(1)})])[1] == "example"
    assert schema_of([seq({"a": ints(1)}), seq(lists={"l": []})])[1] == "sequence_example"
    assert schema_of([seq({"a": ints(1)}, {"l": [ints(1)]})], "example") == ({"a": "int64"}, "example")


def test_inference_errors() -> None:
    with pytest.raises(InputError, match=r"shard-00001.tfrecord, record 1, column 'x': holds bytes_list, but earlier values of this feature are int64_list"):
        infer_schema([seq({"x": ints(1)}), seq({"x": strs("a")})], path=PATH)
    with pytest.raises(SchemaError, match="record 0, column 'x'"):
        infer_schema([seq({"x": ints(1)}, {"x": [ints(1)]})], path=PATH)
    with pytest.raises(CorruptRecordError, match="record 7: malformed"):
        infer_schema([seq({"x": ints(1)}), b"\x0a\x05\x01"], path=PATH, first_record=6)
    with pytest.raises(InputError, match="no records"):
        infer_schema([], path=PATH)
    with pytest.raises(UsageError):
        infer_schema([seq()], "tf_example")


# --- decoding to a given schema -------------------------------------------------------------------

def test_decode_casts_to_the_schema() -> None:
    payloads = [
        seq({"i8": ints(-128), "u8": ints(255), "flag": ints(1), "f64": floats(0.1), "pair": ints(1, 2),
             "name": strs("é"), "blob": strs(b"\xff")},
            {"steps": [ints(1, 2), ints(3)], "small": [ints(7), ints(-7)]}),
        seq({"i8": ints(127), "u8": ints(0), "flag": ints(0), "pair": ints(3, 4)}, {"steps": []}),
    ]
    schema = pa.schema([
        ("i8", pa.int8()), ("u8", pa.uint8()), ("flag", pa.bool_()), ("f64", pa.float64()),
        ("pair", pa.list_(pa.int64(), 2)), ("name", pa.large_string()), ("blob", pa.large_binary()),
        ("steps", pa.large_list(pa.list_(pa.int32()))), ("small", pa.list_(pa.int16())),
    ])
    batch = decode_records(payloads, schema, "sequence_example", path=PATH, first_record=0)
    assert batch.schema == schema
    assert batch.to_pydict() == {
        "i8": [-128, 127], "u8": [255, 0], "flag": [True, False], "f64": [float(np.float32(0.1)), None],
        "pair": [[1, 2], [3, 4]], "name": ["é", None], "blob": [b"\xff", None],
        "steps": [[[1, 2], [3]], []], "small": [[7, -7], None],
    }


def test_decode_reads_only_the_schema_columns_in_schema_order() -> None:
    payloads = [seq({"a": ints(1), "b": strs("x"), "bad": strs("oops")}, {"l": [floats(1.5)]})]
    schema = pa.schema([("l", pa.list_(pa.float32())), ("a", pa.int64())])
    assert decode(payloads, schema) == {"l": [[1.5]], "a": [1]}


def test_list_column_reads_a_feature_list_or_a_context_list() -> None:
    payloads = [seq(lists={"x": [ints(1), ints(2)]}), seq({"x": ints(3, 4, 5)}), seq()]
    assert decode(payloads, pa.schema([("x", pa.list_(pa.int64()))])) == {"x": [[1, 2], [3, 4, 5], None]}


def test_example_kind_ignores_feature_lists() -> None:
    payloads = [seq({"a": ints(1)}, {"a2": [ints(1)]})]
    schema = pa.schema([("a", pa.int64()), ("a2", pa.list_(pa.int64()))])
    assert decode(payloads, schema, "example") == {"a": [1], "a2": [None]}


def test_scalar_column_with_three_values() -> None:
    message = error(InputError, [seq({"x": ints(1)}), seq({"x": ints(1)}), seq({"x": ints(1, 2, 3)})],
                    pa.schema([("x", pa.int64())]))
    assert message == (f"{PATH}, record 12, column 'x': expected exactly 1 value, found 3 (schema type int64)")


def test_fixed_size_step_with_wrong_count() -> None:
    schema = pa.schema([("v", pa.list_(pa.list_(pa.float32(), 4)))])
    payloads = [seq(lists={"v": [floats(1, 2, 3, 4)]}), seq(lists={"v": [floats(1, 2, 3, 4), floats(1, 2, 3)]})]
    message = error(InputError, payloads, schema)
    assert message.startswith(f"{PATH}, record 11, column 'v': feature list step 1: has 3 values, expected 4")


def test_list_step_with_two_values_where_one_is_expected() -> None:
    message = error(InputError, [seq(lists={"t": [ints(1), ints(1, 2)]})], pa.schema([("t", pa.list_(pa.int64()))]))
    assert "record 10, column 't': feature list step 1: expected 1 value per step, found 2" in message


def test_wrong_kind_of_list() -> None:
    message = error(InputError, [seq({"x": ints(1)}), seq({"x": strs("a")})], pa.schema([("x", pa.int64())]))
    assert message == f"{PATH}, record 11, column 'x': expected int64_list, found bytes_list"
    message = error(InputError, [seq(lists={"v": [floats(1.0), ints(2)]})], pa.schema([("v", pa.list_(pa.float32()))]))
    assert "record 10, column 'v': feature list step 1: expected float_list, found int64_list" in message


def test_malformed_protobuf() -> None:
    message = error(CorruptRecordError, [seq(), b"\x0a\xff"], pa.schema([("x", pa.int64())]))
    assert message.startswith(f"{PATH}, record 11: malformed Example/SequenceExample protobuf")
    truncated_feature = raw_seq({"x": b"\x1a\x05\x0a\x03\x01"})
    message = error(CorruptRecordError, [truncated_feature], pa.schema([("x", pa.int64())]))
    assert message.startswith(f"{PATH}, record 10, column 'x': malformed Feature protobuf")
    unterminated = raw_seq({}, {"s": [ld(0x1A, ld(0x0A, b"\x01")), ld(0x1A, ld(0x0A, b"\x80")), ld(0x1A, ld(0x0A, b"\x01"))]})
    message = error(CorruptRecordError, [unterminated], pa.schema([("s", pa.list_(pa.int64()))]))
    assert message.startswith(f"{PATH}, record 10, column 's': feature list step 1: malformed Feature protobuf")


def test_missing_feature_in_non_nullable_field() -> None:
    schema = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    assert decode([seq({"x": ints(4)})], schema) == {"x": [4]}
    message = error(InputError, [seq({"x": ints(4)}), seq({"y": ints(1)})], schema)
    assert "record 11, column 'x': feature is missing and the schema field is not nullable" in message


def test_feature_in_the_wrong_place() -> None:
    message = error(InputError, [seq(lists={"x": [ints(1)]})], pa.schema([("x", pa.int64())]))
    assert "record 10, column 'x': is a feature list, but the schema has a scalar column" in message
    message = error(InputError, [seq({"x": ints(1)})], pa.schema([("x", pa.list_(pa.list_(pa.int64())))]))
    assert "record 10, column 'x': is a context feature, but the schema has a list-of-lists column" in message


def test_lossy_casts_are_refused() -> None:
    message = error(InputError, [seq({"x": ints(1)}), seq({"x": ints(200)})], pa.schema([("x", pa.int8())]))
    assert message == f"{PATH}, record 11, column 'x': value 200 does not fit the schema type int8"
    assert "value -1 does not fit" in error(InputError, [seq({"x": ints(-1)})], pa.schema([("x", pa.uint64())]))
    assert "value 2 does not fit the schema type bool" in error(
        InputError, [seq({"x": ints(0, 2)})], pa.schema([("x", pa.list_(pa.bool_()))]))
    message = error(InputError, [seq(lists={"s": [strs("ok"), strs(b"\xff")]})], pa.schema([("s", pa.list_(pa.string()))]))
    assert "record 10, column 's': feature list step 1: value b'\\xff' is not valid UTF-8" in message


def test_unsupported_schema_types() -> None:
    for t in (pa.struct([("a", pa.int64())]), pa.timestamp("s"), pa.list_(pa.list_(pa.list_(pa.int64())))):
        with pytest.raises(SchemaError, match="column 'c': type"):
            decode_records([seq()], pa.schema([("c", t)]), "sequence_example", path=PATH, first_record=0)
    with pytest.raises(SchemaError):
        decode_records([ex({})], pa.schema([("c", pa.list_(pa.list_(pa.int64())))]), "example",
                       path=PATH, first_record=0)
    with pytest.raises(UsageError):
        decode_records([seq()], pa.schema([]), "auto", path=PATH, first_record=0)


def test_non_canonical_encodings_decode_like_canonical_ones() -> None:
    unpacked_ints = ld(0x1A, b"".join(b"\x08" + varint(v) for v in (5, -1, 300)))
    unpacked_floats = ld(0x12, b"".join(b"\x0d" + struct.pack("<f", v) for v in (1.5, -2.0)))
    split_packed = ld(0x1A, ld(0x0A, varint(1)) + ld(0x0A, varint(2) + varint(3)))
    unknown_field = ld(0x1A, ld(0x0A, varint(9))) + b"\x20\x01"
    payloads = [raw_seq({"i": unpacked_ints, "f": unpacked_floats}, {"s": [split_packed, unknown_field]})]
    schema = pa.schema([("i", pa.list_(pa.int64())), ("f", pa.list_(pa.float32())),
                        ("s", pa.list_(pa.list_(pa.int64())))])
    assert decode(payloads, schema) == {"i": [[5, -1, 300]], "f": [[1.5, -2.0]], "s": [[[1, 2, 3], [9]]]}
    assert schema_of(payloads)[0] == {k: str(v) for k, v in zip(schema.names, schema.types)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=5), max_size=6))
def test_packed_fast_path_agrees_with_the_protobuf_parser(steps: list[list[int]]) -> None:
    canonical = seq(lists={"s": [ints(*values) for values in steps]})
    unpacked = raw_seq({}, {"s": [ld(0x1A, b"".join(b"\x08" + varint(v) for v in values)) for values in steps]})
    schema = pa.schema([("s", pa.list_(pa.list_(pa.int64())))])
    assert decode([canonical], schema) == decode([unpacked], schema) == {"s": [steps]}


def test_long_steps_and_multibyte_lengths() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((5, 40)).astype(np.float32)
    tokens = [int(v) for v in rng.integers(-(1 << 62), 1 << 62, 200)]
    payloads = [seq(lists={"v": [floats(*row) for row in vectors], "t": [ints(*tokens)]})]
    schema = pa.schema([("v", pa.list_(pa.list_(pa.float32(), 40))), ("t", pa.list_(pa.list_(pa.int64())))])
    assert decode(payloads, schema) == {"v": [vectors.tolist()], "t": [[tokens]]}


# --- encoding ---------------------------------------------------------------------------------------

def batches(kind: str) -> st.SearchStrategy[pa.RecordBatch]:
    """Every column shape a payload kind holds; no float64 (tf.train.FloatList is float32)."""
    shapes = SHAPES if kind == "sequence_example" else ("scalar", "list")
    return record_batches(leaves={k: v for k, v in LEAVES.items() if k != "float64"}, shapes=shapes, max_columns=5)


def reference_bytes(batch: pa.RecordBatch, kind: str) -> list[bytes]:
    """The same rows serialized by the protobuf classes (deterministic: sorted map keys)."""
    out = []
    for row in batch.to_pylist():
        message = SequenceExample() if kind == "sequence_example" else Example()
        features = message.context.feature if kind == "sequence_example" else message.features.feature
        for field in batch.schema:
            value = row[field.name]
            if value is None:
                continue
            leaf_type = field.type
            while pa.types.is_list(leaf_type) or pa.types.is_fixed_size_list(leaf_type):
                leaf_type = leaf_type.value_type
            leaf = ("int64" if pa.types.is_integer(leaf_type) or pa.types.is_boolean(leaf_type)
                    else "float" if pa.types.is_floating(leaf_type) else "bytes")
            if kind == "sequence_example" and isinstance(value, list):
                steps = message.feature_lists.feature_list.get_or_create(field.name).feature
                for step in value:
                    steps.add().CopyFrom(feature(leaf, step if isinstance(step, list) else [step]))
            else:
                features[field.name].CopyFrom(feature(leaf, value if isinstance(value, list) else [value]))
        out.append(message.SerializeToString(deterministic=True))
    return out


@pytest.mark.parametrize("kind", ["sequence_example", "example"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_round_trip_and_byte_identity(kind: str, data: st.DataObject) -> None:
    batch = data.draw(batches(kind))
    encoded = encode_records(batch, kind)
    assert encoded == reference_bytes(batch, kind)
    decoded = decode_records(encoded, batch.schema, kind, path=PATH, first_record=0)
    assert decoded.equals(batch), (decoded.to_pydict(), batch.to_pydict())
    if batch.num_rows > 1:
        assert encode_records(batch.slice(1), kind) == encoded[1:]


def test_sequence_columns_choose_the_feature_lists() -> None:
    batch = pa.record_batch({"ctx": pa.array([[1, 2, 3]]), "steps": pa.array([[4, 5]]), "n": pa.array([2])})
    (payload,) = encode_records(batch, sequence_columns=["steps"])
    message = SequenceExample.FromString(payload)
    assert list(message.context.feature["ctx"].int64_list.value) == [1, 2, 3]
    assert [list(f.int64_list.value) for f in message.feature_lists.feature_list["steps"].feature] == [[4], [5]]
    assert decode([payload], batch.schema) == batch.to_pydict()
    (default,) = encode_records(batch)
    assert sorted(SequenceExample.FromString(default).feature_lists.feature_list.keys()) == ["ctx", "steps"]


def test_map_keys_are_sorted_by_utf8_bytes() -> None:
    batch = pa.record_batch({"b": pa.array([1]), "aa": pa.array([2]), "a": pa.array([3]), "é": pa.array([4])})
    (payload,) = encode_records(batch)
    assert payload.index(b"\x01a\x12") < payload.index(b"\x02aa") < payload.index(b"\x01b") < payload.index(b"\xc3\xa9")


@pytest.mark.parametrize("column", [pa.array([0.1, None], pa.float64()),
                                    pa.array([[0.5], []], pa.list_(pa.float64())),
                                    pa.array([[[0.5, 1.0]]], pa.list_(pa.list_(pa.float64(), 2)))])
def test_float64_is_refused_not_rounded(column: pa.Array) -> None:
    with pytest.raises(SchemaError, match="column 'x': .* cannot be stored exactly in a tf.train.FloatList"):
        encode_records(pa.record_batch({"x": column}))


def test_float16_and_float32_are_exact() -> None:
    batch = pa.record_batch({"h": pa.array([np.float16(0.1), None], pa.float16()),
                             "f": pa.array([np.float32(0.1), np.float32(1e38)], pa.float32())})
    assert decode(encode_records(batch, "example"), batch.schema, "example") == batch.to_pydict()


def test_nan_and_empty_records() -> None:
    batch = pa.record_batch({"x": pa.array([float("nan"), None], pa.float32())})
    encoded = encode_records(batch, "example")
    assert encoded[1] == b""
    assert np.isnan(decode(encoded, batch.schema, "example")["x"][0])


def test_encoding_errors() -> None:
    unsupported = [pa.array([{"a": 1}]), pa.array(["x"]).dictionary_encode(), pa.array([1], pa.decimal128(5, 2)),
                   pa.array([1], pa.timestamp("s")), pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))]
    for column in unsupported:
        with pytest.raises(SchemaError, match=re.escape(f"column 'c': type {column.type}")):
            encode_records(pa.record_batch({"c": column}))
    with pytest.raises(SchemaError, match="column 'c'"):
        encode_records(pa.record_batch({"c": pa.array([[[1]]])}), "example")
    with pytest.raises(InputError, match="row 1 of a batch, column 'c': a value inside a list is null"):
        encode_records(pa.record_batch({"c": pa.array([[1], [2, None]])}))
    with pytest.raises(InputError, match="row 0 of a batch, column 'c': a feature-list step is null"):
        encode_records(pa.record_batch({"c": pa.array([[[1], None]])}))
    with pytest.raises(InputError, match="row 1 of a batch, column 'c': a value exceeds the int64 range"):
        encode_records(pa.record_batch({"c": pa.array([1, 1 << 63], pa.uint64())}))
    batch = pa.record_batch({"s": pa.array([1]), "n": pa.array([[[1]]])})
    with pytest.raises(SchemaError, match="not columns of the batch"):
        encode_records(batch, sequence_columns=["missing"])
    with pytest.raises(SchemaError, match="column 's': listed as a sequence column"):
        encode_records(batch, sequence_columns=["s", "n"])
    with pytest.raises(SchemaError, match="column 'n': type .* can only be a feature list"):
        encode_records(batch, sequence_columns=[])
    with pytest.raises(UsageError):
        encode_records(batch, "example", sequence_columns=["n"])
    with pytest.raises(UsageError):
        encode_records(batch, "tf_example")
    with pytest.raises(SchemaError, match="duplicate"):
        encode_records(pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["d", "d"]))


# --- the schema pass: NumPy's walk of the wire format agrees with protobuf's parse -----------------

VALUES = {"int64": st.lists(st.integers(-2**63, 2**63 - 1), max_size=12),
          "float": st.lists(st.floats(width=32), max_size=12),
          "bytes": st.lists(st.binary(max_size=6) | st.text(max_size=3).map(str.encode), max_size=12)}
FEATURES = st.one_of(st.just(("none", [])), *(st.tuples(st.just(k), v) for k, v in VALUES.items()))
NAMES = st.sampled_from(["a", "b", "é", "long-feature-name"])


@st.composite
def sequence_examples(draw) -> bytes:
    """A SequenceExample (or an Example) as protobuf serializes it, of any names, kinds, counts and steps."""
    def made(drawn: tuple[str, list]) -> Any:
        kind, values = drawn
        return Feature() if kind == "none" else feature(kind, values)
    context = {n: made(draw(FEATURES)) for n in draw(st.lists(NAMES, max_size=3, unique=True))}
    if draw(st.booleans()):
        return ex(context)
    lists = {n: [made(draw(FEATURES)) for _ in range(draw(st.integers(0, 6)))]
             for n in draw(st.lists(st.sampled_from(["s", "t", "a"]), max_size=2, unique=True))}
    return seq(context, lists)


@given(st.lists(sequence_examples(), min_size=1, max_size=70))
@settings(max_examples=40, deadline=None)
def test_the_wire_walk_sees_what_protobuf_sees(payloads: list[bytes]) -> None:
    try:
        parsed = _seen(_occurrences_parsed(payloads, "auto", PATH, 3), PATH, 3)
    except InputError as error:
        with pytest.raises(type(error)) as info:
            _seen(_occurrences_fast(payloads, "auto"), PATH, 3)
        assert str(info.value) == str(error)
        return
    assert _seen(_occurrences_fast(payloads, "auto"), PATH, 3) == parsed
    assert scan_records(payloads, path=PATH, first_record=3).features == parsed


def test_the_wire_walk_sees_long_lists_as_protobuf_does() -> None:
    """Many messages walked round by round, a few long ones split by protobuf: both agree with the parse."""
    payloads = [seq({"n": ints(*range(-i, 300 * i, 7)), "s": strs(*[b"x" * i] * i)},
                    {"l": [floats(*[0.5] * (i % 3)) for _ in range(i)], "w": [ints(2**62, -1)] * (i % 70)})
                for i in range(200)]
    parsed = _seen(_occurrences_parsed(payloads, "auto", PATH, 0), PATH, 0)
    assert _seen(_occurrences_fast(payloads, "auto"), PATH, 0) == parsed
    assert schema_of(payloads)[0] == {"n": "list<item: int64>", "s": "list<item: string>",
                                      "l": "list<item: list<item: float>>",
                                      "w": "list<item: fixed_size_list<item: int64>[2]>"}
