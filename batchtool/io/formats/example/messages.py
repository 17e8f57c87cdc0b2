"""The tf.train.Example protobuf messages, built at import in a private pool (no TensorFlow, no generated code),
and parsing them with errors that name the record or Feature."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from batchtool.core.errors import CorruptRecordError, where
from batchtool.io.formats import wire

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

ONEOF_KINDS = (None, "bytes", "float", "int64")
"""Feature's oneof field number -> value kind (0: no kind set)."""
KIND_FIELD = {"bytes": "bytes_list", "float": "float_list", "int64": "int64_list"}
"""Value kind -> the Feature field that holds it."""


class BadFeature(Exception):
    """A Feature that cannot be read as asked, by its position in the run being decoded."""

    def __init__(self, index: int, message: str, corrupt: bool = False) -> None:
        super().__init__(message)
        self.index = index
        self.message = message
        self.corrupt = corrupt


_FIELDS: dict[str, dict[int, tuple[str, tuple[int, ...], str | None]]] = {
    "Example": {1: ("features", (2,), "Features")},
    "SequenceExample": {1: ("context", (2,), "Features"), 2: ("feature_lists", (2,), "FeatureLists")},
    "Features": {1: ("feature", (2,), "FeatureEntry")},
    "FeatureEntry": {1: ("key", (2,), None), 2: ("value", (2,), "Feature")},
    "FeatureLists": {1: ("feature_list", (2,), "FeatureListEntry")},
    "FeatureListEntry": {1: ("key", (2,), None), 2: ("value", (2,), "FeatureList")},
    "FeatureList": {1: ("feature", (2,), "Feature")},
    "Feature": {1: ("bytes_list", (2,), "BytesList"), 2: ("float_list", (2,), "FloatList"),
                3: ("int64_list", (2,), "Int64List")},
    "BytesList": {1: ("value", (2,), None)},
    "FloatList": {1: ("value", (2, 5), None)},
    "Int64List": {1: ("value", (2, 0), None)},
}
"""Each tf.train message's fields: number -> (name, the wire types protobuf parses it from, its message type). A
field of a declared number in another wire type is set aside by protobuf as unknown, as if absent."""


def _set_aside(message: Any, numbers: Collection[int]) -> bool:
    """Protobuf kept a field of one of these declared numbers aside as unknown: its wire type is not the declared
    one (or, in a map, its entry does not parse), so reading on would take it for absent."""
    unknown = UnknownFieldSet(message)
    return len(unknown) > 0 and any(field.field_number in numbers for field in unknown)


def misparsed(data: bytes, message: str, feature: str | None = None) -> tuple[str | None, str]:
    """(the feature, what is wrong) for a `message` in which protobuf set a declared field aside: the first field,
    walked down from it, whose wire type is not its declared one. Walked in plain Python: only for an error."""
    return _first_wrong(data, message, feature) or (feature, f"a field of the {message} that does not parse as "
                                                              "declared")


def _first_wrong(data: bytes, message: str, feature: str | None) -> tuple[str | None, str] | None:
    fields = _FIELDS[message]
    try:
        walked = list(wire.walk(data)) if message.endswith("Entry") else wire.walk(data)
        if message.endswith("Entry"):  # name the feature, wherever the key is in the entry
            feature = next((p.decode("utf-8", "replace") for n, w, p in walked if n == 1 and w == 2), feature)
        step = 0
        for number, wire_type, payload in walked:
            if number not in fields:
                continue
            name, expected, child = fields[number]
            if wire_type not in expected:
                return feature, (f"{message}.{name} (field {number}) has wire type {wire_type} "
                                 f"({wire.WIRE_TYPES.get(wire_type, 'a group')}), expected "
                                 f"{' or '.join(wire.WIRE_TYPES[w] for w in expected)}")
            found = _first_wrong(payload, child, feature) if child and wire_type == 2 else None
            if found is not None:
                return (found[0], f"feature list step {step}: {found[1]}") if message == "FeatureList" else found
            step += 1
    except wire.MalformedWire as exc:
        return feature, f"a malformed {message} ({exc})"
    return None


def parse_feature(raw: bytes, index: int) -> Any:
    """One Feature message; a parse failure, or a field protobuf set aside (a wrong wire type), names its
    position."""
    try:
        feature = Feature.FromString(raw)
    except DecodeError as exc:
        raise BadFeature(index, f"malformed Feature protobuf ({exc})", corrupt=True) from None
    kind = feature.WhichOneof("kind")
    if _set_aside(feature, _FIELDS["Feature"]) or (kind is not None and _set_aside(getattr(feature, kind), (1,))):
        raise BadFeature(index, misparsed(raw, "Feature")[1], corrupt=True)
    return feature


def check_records(parsed: Sequence[Any], payloads: Sequence[bytes], kind: str, path: str | None,
                  first_record: int) -> None:
    """CorruptRecordError naming the record (and feature) of the first view in which protobuf set a declared
    field of the record, its features or its feature lists aside (a wrong wire type): read on, the field would be
    taken for absent. Each feature list read is checked where it is read (check_steps), each Feature where it is
    parsed (parse_feature)."""
    example = kind == "example"
    top = (1,) if example else (1, 2)  # an Example has no field 2: what is there is unknown, not misparsed
    for i, view in enumerate(parsed):
        if _set_aside(view, top) or _set_aside(view.context, (1,)) or (
                not example and _set_aside(view.feature_lists, (1,))):
            raise_misparsed(payloads[i], kind, path, first_record + i)


def check_steps(steps: Any, payload: bytes, kind: str, path: str | None, record: int) -> None:
    """check_records for one feature list of a record (a FeatureListView), as it is read."""
    if _set_aside(steps, (1,)):
        raise_misparsed(payload, kind, path, record)


def raise_misparsed(payload: bytes, kind: str, path: str | None, record: int) -> None:
    """The CorruptRecordError for a record protobuf set a declared field of aside, saying which (misparsed)."""
    # a record of unknown kind is told as an Example where both say the same (field 1)
    names = ("Example",) if kind == "example" else ("SequenceExample",) if kind == "sequence_example" \
        else ("Example", "SequenceExample")
    feature, problem = next((found for name in names if (found := _first_wrong(payload, name, None))),
                            misparsed(payload, names[-1]))
    raise CorruptRecordError(f"{where(path, record=record, column=feature)}: {problem}")


def parse_records(payloads: Sequence[bytes], path: str | None, first_record: int,
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
