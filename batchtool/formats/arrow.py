"""Arrow IPC file shards: one record batch per batch, read by memory map, so an epoch of `load` only touches pages."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa

from batchtool import fs
from batchtool.errors import InputError, where
from batchtool.formats.base import Batches, EncodedBatch, Format, first_line, schema_problem

if TYPE_CHECKING:
    from batchtool.dataset import Chunk, Dataset, ReadReport, Shard
    from batchtool.output import OutputOptions

MAGIC = b"ARROW1"


def open_file(path: str) -> pa.ipc.RecordBatchFileReader:
    """Open one shard, memory-mapped when local (batches are then views of the page cache), as one-line errors."""
    try:
        source = fs.open_input(path) if fs.is_uri(path) else pa.memory_map(path, "r")
        return pa.ipc.open_file(source)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{where(path)}: not a readable Arrow IPC file ({first_line(exc)})") from exc


def read_batch(reader: pa.ipc.RecordBatchFileReader, path: str, index: int,
               columns: list[str] | None) -> pa.RecordBatch:
    """Batch `index` of an open file (O(1): the footer says where it is), its buffers' sizes checked.

    Only the structure is checked here: the commands also check every offset and value against the type
    (a full pass over the data, on their worker threads); the loader, which hands out views of what the
    writer wrote and checksummed, does not.
    """
    try:
        batch = reader.get_batch(index)
        if columns is not None:
            batch = batch.select(columns)
        batch.validate()
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise InputError(f"{where(path)}, record batch {index}: corrupt ({first_line(exc)})") from exc
    return batch


def batch_rows(path: str) -> list[int]:
    """Rows of each batch of a file (compressed files decompress each batch to learn it)."""
    reader = open_file(path)
    return [read_batch(reader, path, i, []).num_rows for i in range(reader.num_record_batches)]


class _Sink:
    """An Arrow IPC file: one record batch per batch, buffers compressed with `codec` (or not)."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, codec: str) -> None:
        options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
        self._writer = pa.ipc.new_file(file, schema, options=options)

    def write(self, encoded: EncodedBatch) -> None:
        self._writer.write_batch(encoded.data)

    def close(self) -> dict:
        self._writer.close()
        return {}

    def abandon(self) -> None:
        self._writer.close()


@dataclass(frozen=True)
class _Task:
    """One record batch of a shard (read, so decompressed, by the reader thread), checked in full and cast
    to the dataset's schema."""

    shard: Shard
    index: int
    first_row: int
    batch: pa.RecordBatch
    schema: pa.Schema

    def __call__(self) -> Chunk:
        from batchtool.dataset import shard_chunk

        batch = self.batch
        try:
            batch.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise InputError(f"{where(self.shard.path)}, record batch {self.index}: corrupt ({first_line(exc)})") \
                from exc
        return shard_chunk(batch, self.schema, self.shard, self.first_row)


@dataclass(frozen=True)
class _Batches(Batches):
    """Record batch i is batch i, found through the file's footer."""

    paths: tuple[str, ...]

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        return np.asarray(batch_rows(self.paths[f]), dtype=np.int64)[local]

    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict) -> _Read:
        opened = cache.get(f)
        if opened is None:
            opened = cache[f] = _OpenFile(self.paths[f], open_file(self.paths[f]), threading.Lock())
        return _Read(opened, tuple(int(i) for i in local), columns)


@dataclass(frozen=True)
class _OpenFile:
    """A shard opened once for a block of reads: its footer (one entry per batch) is parsed once, not once per
    run of batches a shuffled epoch reads from it. The lock keeps the reader to one thread at a time (a
    zero-copy read from the map takes microseconds)."""

    path: str
    reader: pa.ipc.RecordBatchFileReader
    lock: threading.Lock


@dataclass(frozen=True)
class _Read:
    """Record batches of one file: views of its memory map when uncompressed, decompressed here otherwise."""

    file: _OpenFile
    batches: tuple[int, ...]
    columns: list[str] | None

    def __call__(self) -> list[pa.RecordBatch]:
        with self.file.lock:
            return [read_batch(self.file.reader, self.file.path, i, self.columns) for i in self.batches]


class ArrowFormat(Format):
    """Arrow IPC file format (`.arrow`): what pyarrow, polars, DuckDB and HuggingFace datasets map directly."""

    name = "arrow"
    label = "Arrow IPC"
    suffixes = (".arrow", ".ipc")
    codecs = ("none", "lz4", "zstd")
    default_codec = "none"
    magic = MAGIC

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: OutputOptions) -> _Sink:
        return _Sink(file, schema, options.codec)

    def encode(self, batch: pa.RecordBatch, options: OutputOptions) -> EncodedBatch:
        """The IPC writer stores a sliced column's whole buffers (a string column sliced at offset 0 keeps
        its parent's values): columns holding more than they show are copied compact, so the bytes depend
        on the values only, not on how the batch was cut (spill parts, --memory)."""
        columns = [pa.concat_arrays([c]) if c.get_total_buffer_size() > c.nbytes else c for c in batch.columns]
        return EncodedBatch(pa.RecordBatch.from_arrays(columns, schema=batch.schema))

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: dict) -> Dataset:
        from batchtool.dataset import open_self_describing

        return open_self_describing(src, self, shards, schema, manifest,
                                    lambda path: (open_file(path).schema, sum(batch_rows(path))))

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        return sum(batch_rows(shard.path))

    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, _Batches]:
        """The manifest's batch counts, or each file's record batches."""
        paths = tuple(s.path for s in dataset.shards)
        entries = dataset.manifest["output"]["files"] if dataset.manifest else None
        counts = np.array([e["batches"] for e in entries] if entries is not None
                          else [open_file(p).num_record_batches for p in paths], dtype=np.int64)
        return counts, _Batches(paths)

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int, str | None]:
        """From the batch headers: every non-empty record batch is a batch."""
        rows = batch_rows(path)
        return sum(rows), sum(1 for r in rows if r), schema_problem(open_file(path).schema, schema)

    def tasks(self, dataset: Dataset, columns: list[str] | None, report: ReadReport) -> Iterator[_Task]:
        schema = dataset.projected_schema(columns)
        for shard in dataset.shards:
            reader = open_file(shard.path)
            first = 0
            for index in range(reader.num_record_batches):
                batch = read_batch(reader, shard.path, index, columns)
                if batch.num_rows:
                    yield _Task(shard, index, first, batch, schema)
                first += batch.num_rows
