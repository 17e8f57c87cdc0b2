"""Column types as batchtool's operations take them: an Arrow extension type (uuid, fixed_shape_tensor, bool8, json,
opaque, user-registered ones) as its storage, written as the extension type again; a string or binary view, a
dictionary-encoded or a run-end encoded column as its plain type; a union refused, naming the column.

Reading unwraps a column of an extension type to its storage type (fixed_size_binary for uuid, a fixed-size list
for a tensor, int8 for bool8) and marks the field with the original one (MARK: the field serialized as Arrow IPC,
as the manifest stores a schema); so does a column of an extension type this process has not registered, which
Arrow reads as its storage with ARROW_KEYS in the field's metadata. Operations carry the mark along with the
field, whatever they do to the column; the writer's schema (`written_schema`) puts the original type back where the
column still holds its storage, or lists of it (pack's per-example lists). A column an operation changed otherwise
is written as it is.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MARK = b"batchtool.extension"
"""Field metadata of an unwrapped column: its original field (base64 Arrow IPC schema of that one field)."""
ARROW_KEYS = (b"ARROW:extension:name", b"ARROW:extension:metadata")
"""How Arrow marks a field of an extension type it does not know: its storage type, with these in its metadata."""


def _lists(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _list_of(t: pa.DataType, value: pa.Field) -> pa.DataType:
    """A list type of t's kind (and size) over `value`."""
    return (pa.list_(value, t.list_size) if pa.types.is_fixed_size_list(t)
            else pa.large_list(value) if pa.types.is_large_list(t) else pa.list_(value))


def _rebuilt(t: pa.DataType, change: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """t with `change` applied to its children (lists, structs, maps): t itself when none changes (a type is only
    ever rebuilt to change it, so one pyarrow would not build again, as a file can hold, stays as it is)."""
    children = [t.field(i) for i in range(t.num_fields)]
    changed = [f.with_type(change(f.type)) for f in children]
    if all(a.type == b.type for a, b in zip(children, changed)):
        return t
    if _lists(t):
        return _list_of(t, changed[0])
    if pa.types.is_struct(t):
        return pa.struct(changed)
    if pa.types.is_map(t):
        entries = changed[0].type
        return pa.map_(entries.field(0), entries.field(1), keys_sorted=t.keys_sorted)
    return t


def _storage(t: pa.DataType) -> pa.DataType:
    """t with every extension type in it (at any depth) replaced by its storage type."""
    if isinstance(t, pa.BaseExtensionType):
        return _storage(t.storage_type)
    return _rebuilt(t, _storage)


_VIEWS = {"string_view": pa.string(), "binary_view": pa.binary()}


def _plain(t: pa.DataType) -> pa.DataType:
    """t with string and binary views as their plain types and dictionaries as their values' type, at any depth:
    representations the kernels operations use do not take, or not as values (a key, a label), and that a batch's
    own dictionaries make unsafe to concatenate or write (a run-end encoded column is decoded by reading_schema, at
    the top only)."""
    if str(t) in _VIEWS:
        return _VIEWS[str(t)]
    if pa.types.is_dictionary(t):
        return _plain(t.value_type)
    return _rebuilt(t, _plain)


def holds_dictionary(t: pa.DataType) -> bool:
    """t is, or holds at any depth, a dictionary type (which reading decodes)."""
    return pa.types.is_dictionary(t) or any(holds_dictionary(t.field(i).type) for i in range(t.num_fields))


def decoded_bytes(array: pa.Array) -> int:
    """Bytes the array takes once its dictionaries (at any depth) are decoded, from its indices and its
    dictionaries' entry sizes alone: a few bytes of indices can repeat a large entry any number of times, so what
    decoding allocates is checked before it is done. Its indices must be valid (Arrow's full validation)."""
    return int(_entry_bytes(array).sum())


def _entry_bytes(array: pa.Array) -> np.ndarray:
    """Bytes each entry of the array takes decoded (values, offsets; bitmaps aside): int64, one per entry."""
    t = array.type
    if isinstance(array, pa.DictionaryArray):
        sizes = pa.array(_entry_bytes(array.dictionary))
        return pc.take(sizes, array.indices).fill_null(0).to_numpy(zero_copy_only=False)
    if isinstance(array, pa.ExtensionArray):
        return _entry_bytes(array.storage)
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.MapArray)):
        offsets = _offsets(array)
        ends = np.concatenate([[0], np.cumsum(_entry_bytes(array.values))])
        return ends[offsets[1:]] - ends[offsets[:-1]] + _offset_bytes(t)
    if isinstance(array, pa.FixedSizeListArray):
        return _entry_bytes(array.flatten()).reshape(len(array), t.list_size).sum(axis=1)
    if isinstance(array, pa.StructArray):
        children = [_entry_bytes(c) for c in array.flatten()]
        return np.sum(children, axis=0) if children else np.zeros(len(array), dtype=np.int64)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return np.diff(_offsets(array)) + _offset_bytes(t)
    try:
        return np.full(len(array), max(t.bit_width // 8, 1), dtype=np.int64)
    except ValueError:  # not fixed-width (a view, a union): bounded by the whole array
        return np.full(len(array), array.nbytes, dtype=np.int64)


def _offset_bytes(t: pa.DataType) -> int:
    large = pa.types.is_large_list(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    return 8 if large else 4


def _offsets(array: pa.Array) -> np.ndarray:
    """A list's or a binary's offsets (a view of its buffer), its slice's only."""
    whole = np.frombuffer(array.buffers()[1], dtype=np.int64 if _offset_bytes(array.type) == 8 else np.int32)
    return whole[array.offset:array.offset + len(array) + 1]


def unsupported(t: pa.DataType) -> str | None:
    """Why operations cannot take a column of type t (read as reading_schema makes it), or None."""
    if pa.types.is_union(t):
        return "a union, which no operation takes"
    if pa.types.is_run_end_encoded(t):
        return "run-end encoded inside another type"  # reading_schema decodes a run-end encoded column
    return next((why for i in range(t.num_fields) if (why := unsupported(t.field(i).type))), None)


def holds_extension(t: pa.DataType) -> bool:
    """t is, or holds at any depth, an extension type."""
    return _storage(t) != t


def _is_extension(field: pa.Field) -> bool:
    return holds_extension(field.type) or ARROW_KEYS[0] in (field.metadata or {})


def reading_schema(schema: pa.Schema) -> pa.Schema:
    """The schema operations see: each field of an extension type (or holding one) as its storage, marked with the
    original; views and run-end encoding as plain types. `schema` itself when nothing changes."""
    if not any(_is_extension(f) or _plain(f.type) != f.type or pa.types.is_run_end_encoded(f.type) for f in schema):
        return schema
    fields = []
    for field in schema:
        if _is_extension(field):
            original = base64.b64encode(pa.schema([field]).serialize().to_pybytes())
            kept = {k: v for k, v in (field.metadata or {}).items() if k not in ARROW_KEYS}
            field = field.with_type(_storage(field.type)).with_metadata({**kept, MARK: original})
        decoded = field.type.value_type if pa.types.is_run_end_encoded(field.type) else field.type
        fields.append(field.with_type(_plain(decoded)))
    return pa.schema(fields, metadata=schema.metadata)


def conform_read(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch read from a file as reading_schema's `schema` says (run-end encoded columns decoded, the rest cast:
    no copy of values for an extension type's storage)."""
    columns = [pc.run_end_decode(c) if pa.types.is_run_end_encoded(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).cast(schema)


def _original(field: pa.Field) -> pa.Field | None:
    """The field a marked one was unwrapped from (its type reconstructed by pyarrow: registered extension types as
    themselves, others as their storage with Arrow's extension metadata); None when unmarked."""
    mark = (field.metadata or {}).get(MARK)
    return None if mark is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(mark))).field(0)


def _wrapped(t: pa.DataType, original: pa.Field) -> pa.DataType | None:
    """The type of a column of type t holding values of the original field (t is its storage, or lists of it):
    t with the original put back; None when t is something else."""
    if t == _plain(_storage(original.type)):
        return original.type
    if _lists(t):
        inner = _wrapped(t.value_type, original)
        if inner is None:
            return None
        return _list_of(t, t.value_field.with_type(inner).with_metadata(
            original.metadata if inner is original.type else t.value_field.metadata))
    return None


def written_schema(schema: pa.Schema) -> pa.Schema:
    """The schema written: each marked field's original type back where the column still holds its storage, or
    lists of it (else the column as it is), and no mark left."""
    if not any(f.metadata and MARK in f.metadata for f in schema):
        return schema
    fields = []
    for field in schema:
        original = _original(field)
        if original is not None:
            kept = {k: v for k, v in field.metadata.items() if k != MARK}
            wrapped = _wrapped(field.type, original)
            if wrapped is original.type:
                kept = {**kept, **(original.metadata or {})}  # an unknown extension type's name and metadata
            field = field.with_type(wrapped or field.type).with_metadata(kept or None)
        fields.append(field)
    return pa.schema(fields, metadata=schema.metadata)


def conform_written(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch of storage types as written_schema's `schema`: its extension columns wrapped (no copy of values)."""
    return batch if batch.schema.equals(schema, check_metadata=True) else batch.cast(schema)


def same_type(a: pa.Field, b: pa.Field) -> bool:
    """Two fields hold the same type as operations take it and as it is written: equal types (a list's child
    field name aside) read from the same extension type, if any."""
    ea, eb = _original(a), _original(b)
    return a.type.equals(b.type) and (ea is None) == (eb is None) and (ea is None or ea.type.equals(eb.type))


def shown_type(field: pa.Field) -> str:
    """A field's type as a person knows it: the extension type it was read from, if it was (one this process does
    not know by its storage and Arrow's name for it)."""
    original = _original(field)
    if original is None:
        return str(field.type)
    name = (original.metadata or {}).get(ARROW_KEYS[0])
    return f"{original.type} (extension {name.decode(errors='replace')})" if name else str(original.type)
