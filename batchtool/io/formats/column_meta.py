"""Schema metadata that describes columns one by one (Hugging Face `datasets` features, pandas' column entries), kept
with each column through every operation and written back describing exactly the columns written.

Reading (`carried`) moves each column's entry of such a key from the schema's metadata onto the column's field (MARK,
with the type the column was read as), leaving the rest of the key in the schema's metadata (the entries' place null,
so that the key is put together in its order). Operations carry a field's metadata with its column whatever they do
(select drops it with the column, rename takes it to the new name; mix keeps what every source says alike: `shared`)
and keep the schema's metadata. Writing (`described`) puts each key together again from its rest and the entries of
the columns written, in their order, that still hold the type they were read as: a column an operation changed
(pack's per-example lists, TFRecord's float32) loses its entry, so no reader is told its old type, and one an
operation added has none (its readers infer it from the Arrow type).
"""
from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from batchtool.io.formats import column_types

MARK = b"batchtool.column_meta"
"""Field metadata of a described column: JSON of its entry under each key, and its type as read ("type": the base64
Arrow IPC schema of one field of that type)."""

Entries = list[tuple[str, Any]]
"""(column name, its entry) for the columns written that keep one, in their order."""


class _Key:
    """A key of a schema's metadata (JSON) that describes columns: how it splits into its entries by column and the
    rest, and how they join again."""

    name: bytes

    def split(self, doc: dict) -> tuple[dict, dict[str, Any]] | None:
        """The rest (each entry's place null) and the entries by column; None when `doc` is not of the expected
        shape."""
        raise NotImplementedError

    def is_rest(self, doc: dict) -> bool:
        """`doc` is a rest `split` left (its entries' place null)."""
        raise NotImplementedError

    def join(self, rest: dict | None, entries: Entries) -> dict | None:
        """The key describing `entries` (None: no key)."""
        raise NotImplementedError


class _HuggingFace(_Key):
    """`datasets`' features: {"info": {"features": {column: feature}}, "fingerprint": ...}. The fingerprint names
    the content of the dataset that wrote it (its caches are keyed by it): no output of batchtool has that content."""

    name = b"huggingface"

    def split(self, doc: dict) -> tuple[dict, dict[str, Any]] | None:
        info = doc.get("info")
        features = info.get("features") if isinstance(info, dict) else None
        if not isinstance(features, dict):
            return None
        rest = {k: v for k, v in doc.items() if k != "fingerprint"}
        rest["info"] = {**info, "features": None}
        return rest, features

    def is_rest(self, doc: dict) -> bool:
        info = doc.get("info")
        return isinstance(info, dict) and "features" in info and info["features"] is None

    def join(self, rest: dict | None, entries: Entries) -> dict | None:
        """No feature left, no key: `datasets` then infers every feature from the Arrow types (as it does for a
        column its features leave out); without a rest, the features alone."""
        if not entries:
            return None
        rest = rest if rest is not None else {"info": {}}
        return {**rest, "info": {**rest["info"], "features": dict(entries)}}


class _Pandas(_Key):
    """pandas' metadata (pyarrow's `Table.from_pandas`): "columns" holds an entry per column (dtype, categories,
    index level name), keyed by its "field_name". A range index ({"kind": "range"} in "index_columns") numbers the
    rows of the file that was written, which no output of batchtool has: it goes (pandas numbers the rows then)."""

    name = b"pandas"

    @staticmethod
    def _column(entry: dict) -> Any:
        return entry.get("field_name", entry.get("name"))

    def split(self, doc: dict) -> tuple[dict, dict[str, Any]] | None:
        columns = doc.get("columns")
        if not isinstance(columns, list):
            return None
        entries = {name: e for e in columns if isinstance(e, dict) and isinstance(name := self._column(e), str)}
        rest = {**doc, "columns": None}
        if isinstance(index := doc.get("index_columns"), list):
            rest["index_columns"] = [i for i in index if isinstance(i, str)]
        return rest, entries

    def is_rest(self, doc: dict) -> bool:
        return "columns" in doc and doc["columns"] is None

    def join(self, rest: dict | None, entries: Entries) -> dict | None:
        """A renamed column's entry takes its new name and is a plain column (no longer an index level); the index
        columns left are those written under their own name. Without a rest (which index, the column labels' type)
        there is nothing to write."""
        if rest is None:
            return None
        columns = [e if self._column(e) == name else {**e, "name": name, "field_name": name} for name, e in entries]
        index = rest.get("index_columns")
        if isinstance(index, list):
            own = {name for name, e in entries if self._column(e) == name}
            rest = {**rest, "index_columns": [i for i in index if isinstance(i, str) and i in own]}
        return {**rest, "columns": columns}


KEYS = (_HuggingFace(), _Pandas())
"""The keys that describe columns."""


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
    if not any(k.name in metadata for k in KEYS) and not _marked(schema):
        return schema
    found: dict[str, dict[str, Any]] = {}
    for key in KEYS:
        doc = _json(metadata.get(key.name))
        parts = key.split(doc) if isinstance(doc, dict) else None
        if parts is not None:
            metadata[key.name] = _dumps(parts[0])
            found[key.name.decode()] = parts[1]
    fields = []
    for field in schema:
        entries = {key: columns[field.name] for key, columns in found.items() if field.name in columns}
        fields.append(_with_mark(field, {"type": _type_text(field.type), **entries} if entries else None))
    return pa.schema(fields, metadata=metadata or None)


def described(schema: pa.Schema) -> pa.Schema:
    """The schema written: each KEYS key that `carried` split, put together from its rest and the entries of the
    columns that still hold the type they were read as (None of them: no key, or pandas' without columns), and no
    MARK left; `schema` itself when it has nothing of the sort."""
    metadata = dict(schema.metadata or {})
    if not any(k.name in metadata for k in KEYS) and not _marked(schema):
        return schema
    marks = [(f, _mark(f)) for f in schema]
    for key in KEYS:
        rest = _json(metadata.get(key.name))
        if key.name in metadata and not (isinstance(rest, dict) and key.is_rest(rest)):
            continue  # not split when read (not ours to edit): as it was
        name = key.name.decode()
        entries = [(f.name, mark[name]) for f, mark in marks
                   if mark is not None and name in mark and _same_type(mark.get("type"), f.type)]
        doc = key.join(rest, entries)
        if doc is None:
            metadata.pop(key.name, None)
        else:
            metadata[key.name] = _dumps(doc)
    return pa.schema([_with_mark(f, None) for f in schema], metadata=metadata or None)


def _alike(mine: dict | None, theirs: Sequence[dict | None]) -> dict:
    """The items of `mine` that each of `theirs` has too."""
    return {k: v for k, v in (mine or {}).items() if all((t or {}).get(k) == v for t in theirs)}


def shared(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The first schema, describing the data only as every schema does (several sources read as one, with the same
    columns of the same types): the metadata items, field metadata items and column entries (MARK) that each of the
    others has alike. The type an extension column was read as (column_types.MARK) is the first's: it is the same."""
    first, others = schemas[0], schemas[1:]
    fields = []
    for field in first:
        theirs = [s.field(field.name) for s in others]
        kept = _alike(field.metadata, [t.metadata for t in theirs])
        kept.update({k: v for k, v in (field.metadata or {}).items() if k == column_types.MARK})
        mark = _mark(field)
        if mark is not None:
            entries = _alike(mark, [_mark(t) for t in theirs])
            mark = {**entries, "type": mark["type"]} if set(entries) - {"type"} else None
        fields.append(_with_mark(field.with_metadata(kept), mark))
    return pa.schema(fields, metadata=_alike(first.metadata, [s.metadata for s in others]) or None)


__all__ = ["KEYS", "MARK", "carried", "described", "shared"]
