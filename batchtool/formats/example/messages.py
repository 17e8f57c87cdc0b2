"""The tf.train.Example protobuf messages, built at import in a private pool (no TensorFlow, no generated code),
and parsing them with errors that name the record or Feature."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from batchtool.errors import CorruptRecordError, where

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


def parse_feature(raw: bytes, index: int) -> Any:
    """One Feature message; a parse failure names its position."""
    try:
        return Feature.FromString(raw)
    except DecodeError as exc:
        raise BadFeature(index, f"malformed Feature protobuf ({exc})", corrupt=True) from None


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
