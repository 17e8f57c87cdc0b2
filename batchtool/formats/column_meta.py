"""Schema metadata that describes columns one by one (Hugging Face `datasets` features, pandas' column entries), kept
with each column through every operation and written back describing exactly the columns written.

Reading (`carried`) moves each column's entry of such a key from the schema's metadata onto the column's field (MARK,
with the type the column was read as), leaving the rest of the key in the schema's metadata (its entries null, so
that the key is put together in its order). Operations carry a
field's metadata with its column whatever they do (select drops it with the column, rename takes it to the new name;
mix keeps what every source says alike: `shared`) and keep the schema's metadata. Writing (`described`) puts each key
together again from its rest and the entries of the columns written, in their order, that still hold the type they
were read as: a column an operation changed (pack's per-example lists, TFRecord's float32) loses its entry, so no
reader is told its old type, and one an operation added has none (its readers infer it from the Arrow type).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

MARK = b"batchtool.column_meta"
"""Field metadata of a described column: JSON of its entry under each key, and its type as read ("type": the base64
Arrow IPC schema of one field of that type)."""

Entries = list[tuple[str, Any]]
"""(column name, its entry) for the columns written that keep one, in their order."""


def _hf_split(doc: dict) -> tuple[dict, dict[str, Any]] | None:
    """`datasets`' metadata: {"info": {"features": {column: feature}}, "fingerprint": ...}. The fingerprint names
    the content of the dataset that wrote it (its caches are keyed by it): no output of batchtool has that content."""
    info = doc.get("info")
    features = info.get("features") if isinstance(info, dict) else None
    if not isinstance(features, dict):
        return None
    rest = {k: v for k, v in doc.items() if k != "fingerprint"}
    rest["info"] = {**info, "features": None}
    return rest, features


def _hf_join(rest: dict | None, entries: Entries) -> dict | None:
    """No feature left, no key: `datasets` then infers every feature from the Arrow types (as it does for a column
    its features leave out)."""
    if not entries:
        return None
    rest = rest if rest is not None else {}
    info = rest.get("info")
    return {**rest, "info": {**(info if isinstance(info, dict) else {}), "features": dict(entries)}}


def _pandas_name(entry: dict) -> Any:
    return entry.get("field_name", entry.get("name"))


def _pandas_split(doc: dict) -> tuple[dict, dict[str, Any]] | None:
    """pandas' metadata (pyarrow's `Table.from_pandas`): "columns" holds an entry per column (dtype, categories,
    index level name), keyed by its "field_name". A range index ({"kind": "range"} in "index_columns") numbers the
    rows of the file that was written, which no output of batchtool has: it goes (pandas numbers the rows then)."""
    columns = doc.get("columns")
    if not isinstance(columns, list):
        return None
    entries = {name: e for e in columns if isinstance(e, dict) and isinstance(name := _pandas_name(e), str)}
    rest = {**doc, "columns": None}
    if isinstance(index := doc.get("index_columns"), list):
        rest["index_columns"] = [i for i in index if isinstance(i, str)]
    return rest, entries


def _pandas_join(rest: dict | None, entries: Entries) -> dict | None:
    """A renamed column's entry takes its new name and is a plain column (no longer an index level); the index
    columns left are those written under their own name. Without its rest (which index, the column labels' type)
    there is nothing to write."""
    if rest is None:
        return None
    columns = [e if _pandas_name(e) == name else {**e, "name": name, "field_name": name} for name, e in entries]
    index = rest.get("index_columns")
    if isinstance(index, list):
        own = {name for name, e in entries if _pandas_name(e) == name}
        rest = {**rest, "index_columns": [i for i in index if isinstance(i, str) and i in own]}
    return {**rest, "columns": columns}


KEYS: dict[bytes, tuple[Callable[[dict], tuple[dict, dict[str, Any]] | None],
                        Callable[[dict | None, Entries], dict | None]]] = {
    b"huggingface": (_hf_split, _hf_join),
    b"pandas": (_pandas_split, _pandas_join),
}
"""Each key that describes columns: how its JSON splits into its rest and entries by column, and how they join."""


def _json(value: bytes | None) -> Any:
    """A metadata value as JSON; None where it is not (a file's metadata is its writer's: not ours to refuse)."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _type_text(t: pa.DataType) -> str:
    return base64.b64encode(pa.schema([pa.field("", t)]).serialize().to_pybytes()).decode("ascii")


def _same_type(text: Any, t: pa.DataType) -> bool:
    """The column still holds the type its mark was made for (a list's child field name aside)."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))).field(0).type.equals(t)
    except (TypeError, ValueError, pa.ArrowException):
        return False


def _mark(field: pa.Field) -> dict | None:
    found = _json((field.metadata or {}).get(MARK))
    return found if isinstance(found, dict) else None


def _with_mark(field: pa.Field, mark: dict | None) -> pa.Field:
    """The field with `mark` as its MARK (None: none), its other metadata as it was."""
    kept = {k: v for k, v in (field.metadata or {}).items() if k != MARK}
    if mark:
        kept[MARK] = _dumps(mark)
    return field.with_metadata(kept) if kept else field.remove_metadata()


def _marked(schema: pa.Schema) -> bool:
    return any(f.metadata and MARK in f.metadata for f in schema)


def carried(schema: pa.Schema) -> pa.Schema:
    """The schema operations see: each KEYS entry of a column on its field (MARK), the rest of the key in the
    schema's metadata (a key that is not JSON of the expected shape stays whole); `schema` itself when it has none.
    A MARK the file itself holds is dropped: only this function makes one."""
    metadata = dict(schema.metadata or {})
    if not any(k in metadata for k in KEYS) and not _marked(schema):
        return schema
    found: dict[str, dict[str, Any]] = {}
    for key, (split, _) in KEYS.items():
        doc = _json(metadata.get(key))
        parts = split(doc) if isinstance(doc, dict) else None
        if parts is not None:
            metadata[key] = _dumps(parts[0])
            found[key.decode()] = parts[1]
    fields = []
    for field in schema:
        entries = {key: columns[field.name] for key, columns in found.items() if field.name in columns}
        fields.append(_with_mark(field, {"type": _type_text(field.type), **entries} if entries else None))
    return pa.schema(fields, metadata=metadata)


def described(schema: pa.Schema) -> pa.Schema:
    """The schema written: each KEYS key that `carried` split, put together from its rest and the entries of the
    columns that still hold the type they were read as (None of them: no key, or pandas' without columns), and no
    MARK left; `schema` itself when it has nothing of the sort."""
    metadata = dict(schema.metadata or {})
    if not any(k in metadata for k in KEYS) and not _marked(schema):
        return schema
    marks = [(f, _mark(f)) for f in schema]
    for key, (split, join) in KEYS.items():
        rest = _json(metadata.get(key))
        if key in metadata and not (isinstance(rest, dict) and split(rest) is None):
            continue  # not split when read (not ours to edit): as it was
        entries = [(f.name, mark[key.decode()]) for f, mark in marks
                   if mark is not None and key.decode() in mark and _same_type(mark.get("type"), f.type)]
        doc = join(rest, entries)
        if doc is None:
            metadata.pop(key, None)
        else:
            metadata[key] = _dumps(doc)
    return pa.schema([_with_mark(f, None) for f in schema], metadata=metadata or None)


def shared(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The first schema, describing the columns only as every schema does (several sources read as one): its
    metadata's keys and its columns' entries that each of the others has alike (same columns assumed)."""
    first, others = schemas[0], schemas[1:]
    metadata = {k: v for k, v in (first.metadata or {}).items()
                if all((s.metadata or {}).get(k) == v for s in others)}
    fields = []
    for field in first:
        mark = _mark(field)
        if mark is not None:
            theirs = [_mark(s.field(field.name)) or {} for s in others]
            kept = {k: v for k, v in mark.items() if k == "type" or all(t.get(k) == v for t in theirs)}
            field = _with_mark(field, kept if len(kept) > 1 else None)
        fields.append(field)
    return pa.schema(fields, metadata=metadata or None)


__all__ = ["KEYS", "MARK", "carried", "described", "shared"]
