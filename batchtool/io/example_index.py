"""The example index every batch output carries beside its data files: the key of each example of each batch, in
batch order, with the permutation that sorts them by key, so that `batchtool where`/`step` find a key's batches or a batch's keys in O(log n)
from a memory map, and `check --receipts` can name the examples of a batch. A function of the data files alone."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import fs
from batchtool.core.errors import BatchtoolError, InputError, OptionError
from batchtool.io.dataset import Dataset, Shard
from batchtool.io.formats.registry import FORMATS
from batchtool.io.ipc_single import NO_VALIDITY, Buffer, write_single_batch
from batchtool.io.key_sort import KeySort, search
from batchtool.io.manifest import dataset_file, manifest_path, schema_from_json
from batchtool.io.output import HashingFile
from batchtool.io.workspace import Workspace

INDEX_NAME = ".batchtool_index"
"""A leading dot, as the manifest's, and no data suffix: directory readers skip it and no `*.arrow` or `*.parquet` glob
(polars and DuckDB match dot files) picks it up, so the output's data files stay the dataset."""
KEY_COLUMN = "key"
"""The column whose values are the examples' keys (a list of them per row in pack output: one per document)."""
READ_BATCHES = 1024
"""Batches of the key column read at a time while the index is built, at most."""
MEMORY_SHARE = 2
"""Building the index (after every data file is written) may hold about half of --memory: the keys it sorts at
once (key_sort.KeySort), the batches it reads and the pieces it writes."""
WINDOW_SHARE = 8
"""The batches of the key column read at once hold about an eighth of the build's share of --memory in keys (at
least one batch): how many follows the key bytes per batch of the batches read before, from one."""
SPOOL_SHARE = 8
"""Each of the index's columns (at most four spools) is held in memory up to an eighth of the build's share of
--memory before it goes to a file: half the share in all, the key sort's runs the other half."""
PIECE_BYTES = 1 << 20
"""The index's columns are streamed into it from the workspace's files in pieces of this size."""
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


class _Spool:
    """A column's bytes as they are read, streamed back into the index: held in memory up to `limit` bytes (an
    output whose index fits writes no file), then appended to a file of the workspace."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit, self.nbytes = path, limit, 0
        self._held: list[bytes] = []
        self._file: BinaryIO | None = None

    def append(self, data: np.ndarray | pa.Buffer) -> None:
        view = memoryview(data).cast("B")
        if self._file is None and self.nbytes + view.nbytes > self.limit:
            self._file = open(self.path, "wb")
            self._file.writelines(self._held)
            self._held = []
        if self._file is None:
            self._held.append(bytes(view))  # a copy: no piece keeps a file's memory map open
        else:
            self._file.write(view)
        self.nbytes += view.nbytes

    def buffer(self) -> Buffer:
        """What was appended (the file closed), as an index body buffer."""
        if self._file is None:
            return Buffer(self.nbytes, functools.partial(iter, tuple(self._held)))
        self._file.close()
        return Buffer(self.nbytes, functools.partial(_file_pieces, self.path))


def _file_pieces(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(PIECE_BYTES):
            yield piece


def _arange_pieces(n: int) -> Iterator[np.ndarray]:
    for start in range(0, n, PIECE_BYTES // 8):
        yield np.arange(start, min(n, start + PIECE_BYTES // 8), dtype=np.int64)


def _key_spools(directory: str, strings: bool, limit: int) -> list[_Spool]:
    """Where the keys go in output order: their values, or (strings) their offsets and characters."""
    if not strings:
        return [_Spool(os.path.join(directory, "keys"), limit)]
    offsets = _Spool(os.path.join(directory, "offsets"), limit)
    offsets.append(np.zeros(1, dtype=np.int64))
    return [offsets, _Spool(os.path.join(directory, "characters"), limit)]


def _spool_keys(spools: list[_Spool], keys: pa.Array) -> None:
    """Append one chunk of keys (int64, or large_string; no nulls) to _key_spools' files."""
    if len(spools) == 1:
        spools[0].append(keys.to_numpy())
        return
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset:keys.offset + len(keys) + 1]
    spools[0].append(offsets[1:] - offsets[0] + spools[1].nbytes)
    spools[1].append(keys.buffers()[2][offsets[0]:offsets[-1]])


def build(directory: str, manifest: dict[str, Any], space: Workspace, memory: int,
          key: str | None = None) -> dict[str, Any]:
    """Write the index of the output in `directory` (its data files written, `manifest` listing them, not yet
    written) as INDEX_NAME there, keyed by key_column(schema, `key`); returns the manifest's `output.index` entry
    (name, key column, examples, size, sha256). Reads only the key column (or, without one, each batch's rows), a
    few batches at a time: the index's columns wait in memory up to their share (SPOOL_SHARE), beyond it in files of
    the workspace `space`, where the keys are also sorted in runs (key_sort), so the build holds about `memory` /
    MEMORY_SHARE however many examples the output has."""
    spec = FORMATS[manifest["output"]["format"]]
    schema = schema_from_json(manifest["schema"])
    shards = tuple(Shard(i, fs.join(directory, f["path"]), f["bytes"]) for i, f in enumerate(manifest["output"]["files"]))
    dataset = Dataset(directory, spec, shards, schema, options=spec.options_of(manifest["output"]), manifest=manifest)
    column = key_column(schema, key)
    with space.errors():
        spill = fs.make_unique_dir(space.directory, "index-")
    try:
        with space.errors():
            key_type, examples, buffers = _spooled(spill, dataset, column, max(1, memory // MEMORY_SHARE),
                                                   space.errors)
        index_schema = pa.schema(zip(_FIELDS, (key_type, pa.int64(), pa.int64())))
        path = os.path.join(directory, INDEX_NAME)
        sink = HashingFile(path)
        try:  # a refused write here is the output's (write.write_manifest names DST)
            write_single_batch(sink.write, index_schema, examples, buffers)
        finally:
            sink.close()
        _read_back(path, index_schema, examples)
    finally:
        fs.remove_tree(spill)
    return {"path": INDEX_NAME, "key": column, "examples": examples, "bytes": sink.bytes,
            "sha256": sink.sha256.hexdigest()}


def _read_back(path: str, schema: pa.Schema, examples: int) -> None:
    """The written index as pyarrow reads it: one batch of `examples` rows of `schema` whose buffers lie where its
    metadata says. ipc_single lays the file out by patching pyarrow's own one-row file; should a pyarrow release
    lay IPC files out another way, the write fails here, before DST is replaced, not in a later lookup."""
    try:
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            if not reader.schema.equals(schema) or sum(b.num_rows for b in batches) != examples or len(batches) > 1:
                raise ValueError(f"{len(batches)} batches, {sum(b.num_rows for b in batches):,} rows")
            for batch in batches:
                batch.validate()
    except (pa.ArrowException, ValueError) as exc:
        raise BatchtoolError(f"{path}: the example index written does not read back as written ({exc}); pyarrow "
                             f"{pa.__version__} lays out Arrow IPC files in a way this batchtool does not know") \
            from None


def _spooled(spill: str, dataset: Dataset, column: str | None, budget: int,
             errors: Callable[[], AbstractContextManager[None]]) -> tuple[pa.DataType, int, list[Buffer]]:
    """The index's key type, examples and body buffers (the columns in output order spooled in `spill` as the
    output is read, the keys sorted there under `budget` bytes)."""
    counts, stored = dataset.spec.open_batches(dataset.src, dataset)
    held = budget // SPOOL_SHARE
    batch = _Spool(os.path.join(spill, "batch"), held)
    sort = None if column is None else KeySort(spill, budget - 4 * held, errors)
    key_type: pa.DataType = pa.int64()  # with no key at all, as before the index was built in pieces
    spools: list[_Spool] = []
    batches = examples = 0

    def record(sizes: np.ndarray) -> None:  # the examples of the next batches
        nonlocal batches, examples
        batch.append(np.repeat(np.arange(batches, batches + len(sizes), dtype=np.int64), sizes))
        batches += len(sizes)
        examples += int(sizes.sum())

    wanted = max(1, budget // WINDOW_SHARE)
    cache: dict = {}
    try:
        for f, count in enumerate(int(c) for c in counts):
            if column is None:
                record(np.asarray(stored.rows(f, np.arange(count, dtype=np.int64)), dtype=np.int64))
                continue
            start, window = 0, 1
            while start < count:
                local = np.arange(start, min(count, start + window), dtype=np.int64)
                columns = [b.column(0) for b in stored.read(f, local, [column], dataset.projected_schema([column]),
                                                            cache)()]
                sizes = np.array([_count(c) for c in columns], dtype=np.int64)
                keys = _keys_of(pa.chunked_array(columns, type=dataset.schema.field(column).type))
                window = max(1, min(READ_BATCHES, wanted * len(local) // max(1, keys.nbytes)))
                if keys.num_chunks:
                    keys = keys.combine_chunks()  # a copy: no key keeps a file's memory map open
                    if not spools:
                        key_type = keys.type
                        spools = _key_spools(spill, pa.types.is_large_string(key_type), held)
                    _spool_keys(spools, keys)
                    sort.add(keys)
                record(sizes)
                start += len(local)
                if stored.in_place():  # views of a memory map: its pages read so far leave this process with it
                    del columns, keys
                    stored.release(cache)
            stored.release(cache)
    finally:
        stored.release(cache)
    if sort is None:
        keys = [Buffer(8 * examples, functools.partial(_arange_pieces, examples))]
        by_key = Buffer(8 * examples, functools.partial(_arange_pieces, examples))
    else:
        keys = [s.buffer() for s in spools]
        order = _Spool(os.path.join(spill, "by_key"), held)
        for positions in sort.positions():
            order.append(positions)
        by_key = order.buffer()
    return key_type, examples, [NO_VALIDITY, *keys, NO_VALIDITY, batch.buffer(), NO_VALIDITY, by_key]


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

    def value(i: int) -> str | int:
        at = int(order[i])
        if not 0 <= at < len(values):
            raise InputError("the example index is damaged: it names an example it does not hold")
        return values[at].as_py()

    return search(value, len(order), key, right)


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
        reader = pa.ipc.open_file(fs.open_random_access(path))
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
