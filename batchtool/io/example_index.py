"""The example index every batch output carries beside its data files: the key of each example of each batch, in
batch order, with the permutation that sorts them by key, so that `batchtool where`/`step` find a key's batches or a batch's keys in O(log n)
from a memory map, and `check --receipts` can name the examples of a batch. A function of the data files alone."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import fs
from batchtool.core.errors import BatchtoolError, InputError, OptionError
from batchtool.io.dataset import Dataset, Shard
from batchtool.io.formats.registry import FORMATS
from batchtool.io.manifest import dataset_file, manifest_path, schema_from_json
from batchtool.io.output import HashingFile

INDEX_NAME = ".batchtool_index"
"""A leading dot, as the manifest's, and no data suffix: directory readers skip it and no `*.arrow` or `*.parquet` glob
(polars and DuckDB match dot files) picks it up, so the output's data files stay the dataset."""
KEY_COLUMN = "key"
"""The column whose values are the examples' keys (a list of them per row in pack output: one per document)."""
READ_BATCHES = 1024
"""Batches of the key column read at a time while the index is built."""
_FIELDS = ("key", "batch", "by_key")
"""Per example in output order: its key, its batch; and the examples in key order (then batch order)."""


class NotFoundError(BatchtoolError):
    """A key the index does not hold: an answer, not bad usage, so exit status 1 (as a failed check)."""

    exit_code = 1


def key_column(schema: pa.Schema, asked: str | None = None) -> str | None:
    """The column the keys come from: `asked` (--key; an OptionError unless the output has it, holding strings or
    integers, or lists of them), else `key` where it does; None: an example's key is its number in the output (file
    order)."""
    if asked is not None:
        if asked not in schema.names:
            raise OptionError("key", f"the output has no such column (it has {', '.join(schema.names)})",
                              value=repr(asked))
        if not _keys_type(schema.field(asked).type):
            raise OptionError("key", f"the column is {schema.field(asked).type}: expected strings or integers (or a "
                              "list of them per row)", value=repr(asked))
        return asked
    return KEY_COLUMN if KEY_COLUMN in schema.names and _keys_type(schema.field(KEY_COLUMN).type) else None


def _keys_type(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)


def _keys_of(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The keys a key column holds, nulls (no example) left out: a list column's elements in order."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    column = column.drop_null()
    return column.cast(pa.large_string() if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                       else pa.int64())


def _count(column: pa.Array) -> int:
    """The examples of one batch's key column: its non-null keys."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = column.flatten()
    return len(column) - column.null_count


def build(directory: str, manifest: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """Write the index of the output in `directory` (its data files written, `manifest` listing them, not yet
    written) as INDEX_NAME there, keyed by key_column(schema, `key`); returns the manifest's `output.index` entry
    (name, key column, examples, size, sha256). Reads only the key column (or, without one, each batch's rows)."""
    spec = FORMATS[manifest["output"]["format"]]
    schema = schema_from_json(manifest["schema"])
    shards = tuple(Shard(i, fs.join(directory, f["path"]), f["bytes"]) for i, f in enumerate(manifest["output"]["files"]))
    dataset = Dataset(directory, spec, shards, schema, options=spec.options_of(manifest["output"]), manifest=manifest)
    counts, stored = spec.open_batches(directory, dataset)
    column = key_column(schema, key)
    keys: list[pa.Array] = []
    sizes: list[np.ndarray] = []
    cache: dict = {}
    try:
        for f, count in enumerate(counts):
            for start in range(0, int(count), READ_BATCHES):
                local = np.arange(start, min(int(count), start + READ_BATCHES), dtype=np.int64)
                if column is None:
                    sizes.append(np.asarray(stored.rows(f, local), dtype=np.int64))
                    continue
                columns = [b.column(0) for b in stored.read(f, local, [column], dataset.projected_schema([column]),
                                                            cache)()]
                sizes.append(np.array([_count(c) for c in columns], dtype=np.int64))
                keys += _keys_of(pa.chunked_array(columns, type=schema.field(column).type)).chunks
            stored.release(cache)
    finally:
        stored.release(cache)
    per_batch = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    batch = np.repeat(np.arange(len(per_batch), dtype=np.int64), per_batch)
    if column is None:
        key = pa.array(np.arange(len(batch), dtype=np.int64))
    else:
        key = pa.chunked_array(keys, type=keys[0].type if keys else pa.int64()).combine_chunks()
    # batches ascend in output order, so a stable sort by key alone orders by (key, batch)
    order = (np.argsort(key.to_numpy(), kind="stable") if pa.types.is_integer(key.type)
             else pc.sort_indices(key).to_numpy().astype(np.int64))
    table = pa.table({"key": key, "batch": batch, "by_key": order})
    sink = HashingFile(os.path.join(directory, INDEX_NAME))
    try:
        with pa.PythonFile(sink, mode="w") as stream, pa.ipc.new_file(stream, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(1, table.num_rows))
    finally:
        sink.close()
    return {"path": INDEX_NAME, "key": column, "examples": int(table.num_rows), "bytes": sink.bytes,
            "sha256": sink.sha256.hexdigest()}


@dataclass(frozen=True)
class ExampleIndex:
    """An output's index, memory-mapped: lookups read O(log n) keys and the keys they return."""

    path: str
    column: str | None
    """The column the keys are from; None: an example's key is its number in the output."""
    batches: int
    """Batches in the output: a batch number the index gives beyond them is a damaged index."""
    table: pa.RecordBatch

    def parse(self, text: str) -> str | int:
        """A key as the command line gives it, in the index's type."""
        if pa.types.is_integer(self.table.column(0).type):
            try:
                return int(text)
            except ValueError:
                what = "row numbers" if self.column is None else f"integers (column {self.column!r})"
                raise InputError(f"{self.path}: the keys of this output are {what}; {text!r} is not one") from None
        return text

    def batches_of(self, key: str | int) -> np.ndarray:
        """The batch of each example with this key (ascending; empty: none has it)."""
        keys, by_key = self.table.column(0), self.table.column(2).to_numpy()
        lo, hi = _bound(keys, by_key, key, False), _bound(keys, by_key, key, True)
        examples = by_key[lo:hi]
        if len(examples) and not (0 <= examples.min() and examples.max() < len(keys)):
            raise InputError(f"{self.path}: names example {int(examples.max())} of {len(keys)}; the index is "
                             "damaged")
        return self._checked(self.table.column(1).to_numpy()[examples])

    def keys_of(self, batch: int) -> list[str | int]:
        """The keys of batch `batch`'s examples, in their order in the batch."""
        batches = self.table.column(1).to_numpy()
        lo, hi = np.searchsorted(batches, batch, "left"), np.searchsorted(batches, batch, "right")
        return self.table.column(0)[lo:hi].to_pylist()

    def first_key(self, batch: int) -> str | int | None:
        """The key of batch `batch`'s first example (None: it holds none), to name the batch."""
        keys = self.keys_of(batch)
        return keys[0] if keys else None

    def _checked(self, batches: np.ndarray) -> np.ndarray:
        if len(batches) and not (0 <= batches.min() and batches.max() < self.batches):
            raise InputError(f"{self.path}: names batch {int(batches.max())}, beyond the output's {self.batches}; "
                             "the index is not this output's")
        return batches


def _bound(values: pa.Array, order: np.ndarray, key: str | int, right: bool) -> int:
    """Where `key` goes in `values` taken in `order` (sorted: numpy's searchsorted, left or right), in O(log n)
    element reads."""
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        at = int(order[mid])
        if not 0 <= at < len(values):
            raise InputError("the example index is damaged: it names an example it does not hold")
        v = values[at].as_py()
        if v < key or (right and v == key):
            lo = mid + 1
        else:
            hi = mid
    return lo


def open_index(dst: str, manifest: dict[str, Any]) -> ExampleIndex:
    """The index `manifest` (DST's, read and checked by manifest_reader) records: an InputError naming the
    file when the output has none, or when the file is not the one recorded (size, columns, lengths)."""
    entry = manifest["output"].get("index")
    where = manifest_path(dst)
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise InputError(f"{dst}: its manifest records no example index (written by batchtool before 0.x, or not "
                         "batch output); write it again to index it")
    path = dataset_file(dst, entry["path"], f"{where}: output.index")
    if not fs.is_file(path):
        raise InputError(f"{path}: listed in {where} but missing")
    if fs.file_size(path) != entry.get("bytes"):
        raise InputError(f"{path}: {fs.file_size(path):,} bytes, {where} says {entry.get('bytes')!r}; the index is "
                         "not this output's")
    try:
        reader = pa.ipc.open_file(pa.memory_map(path))
        table = reader.get_batch(0) if reader.num_record_batches == 1 else None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: unreadable example index ({exc})") from None
    if (table is None or tuple(table.schema.names) != _FIELDS or table.num_rows != entry.get("examples")
            or table.column(1).type != pa.int64() or table.column(2).type != pa.int64()
            or table.column(0).null_count or table.column(1).null_count or table.column(2).null_count):
        raise InputError(f"{path}: not the example index {where} records")
    batches = int(manifest["output"]["batches"])
    return ExampleIndex(path, entry.get("key"), batches, table)


__all__ = ["INDEX_NAME", "ExampleIndex", "NotFoundError", "build", "key_column", "open_index"]
