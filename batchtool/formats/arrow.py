"""Arrow IPC file shards: one record batch per batch, read by memory map, so an epoch of `load` only touches pages."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa

from batchtool import batch_check, fs
from batchtool.errors import InputError, where
from batchtool.formats.base import (Batches, EncodedBatch, Format, ReadTask, first_line, schema_problem,
                                    size_problem)

if TYPE_CHECKING:
    from batchtool.dataset import Chunk, Dataset, ReadReport, Shard
    from batchtool.output import OutputOptions

MAGIC = b"ARROW1"


def open_file(path: str) -> pa.ipc.RecordBatchFileReader:
    """Open one shard, memory-mapped when local (batches are then views of the page cache), as one-line errors."""
    try:
        source = fs.open_input(path) if fs.is_uri(path) else pa.memory_map(path, "r")
        return pa.ipc.open_file(source)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{where(path)}: not a readable Arrow IPC file ({first_line(exc)})") from exc


def read_batch(reader: pa.ipc.RecordBatchFileReader, path: str, index: int, columns: list[str] | None,
               verify: bool = False) -> pa.RecordBatch:
    """Batch `index` of an open file (O(1): the footer says where it is), checked before anything slices it
    (batch_check.check_batch: buffer sizes, offsets, null counts; O(offsets)), and with `verify`, its CRC32C.
    The commands also check every value against its type (a full pass over the data, on their worker threads)."""
    try:
        if verify:
            batch, metadata = reader.get_batch_with_custom_metadata(index)
        else:
            batch, metadata = reader.get_batch(index), None
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise InputError(f"{where(path)}, record batch {index}: corrupt ({first_line(exc)})") from exc
    batch_check.check_batch(batch, path, index)
    if verify:
        batch_check.verify_crc(batch, metadata, path, index)
    return batch if columns is None else batch.select(columns)


def batch_rows(path: str, verify: bool = False) -> list[int]:
    """Rows of each batch of a file (compressed files decompress each batch to learn it; `verify` reads every
    batch whole, for its CRC32C)."""
    reader = open_file(path)
    return [read_batch(reader, path, i, None if verify else [], verify).num_rows
            for i in range(reader.num_record_batches)]


class _Sink:
    """An Arrow IPC file: one record batch per batch, buffers compressed with `codec` (or not)."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, codec: str) -> None:
        options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
        self._writer = pa.ipc.new_file(file, schema, options=options)

    def write(self, encoded: EncodedBatch) -> None:
        """Each record batch carries the CRC32C of its buffers (Arrow IPC has no checksum of its own)."""
        self._writer.write_batch(encoded.data, custom_metadata=batch_check.batch_crc_metadata(encoded.data))

    def close(self) -> dict:
        self._writer.close()
        return {"batch_checksums": batch_check.CHECKSUMS}

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
class Listed:
    """What the manifest says of one file, checked when the file is opened: its size, batches and rows, and
    whether its batches carry CRC32Cs (outputs of older batchtools do not)."""

    bytes: int
    batches: int
    rows: int
    checksums: bool


@dataclass(frozen=True)
class _Batches(Batches):
    """Record batch i is batch i, found through the file's footer (parsed when the file is first read)."""

    paths: tuple[str, ...]
    schema: pa.Schema
    listed: tuple[Listed, ...] | None
    """From the manifest; None for Arrow files without one."""

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        return np.asarray(batch_rows(self.paths[f]), dtype=np.int64)[local]

    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict, verify: bool = False) -> _Read:
        opened = cache.get(f)
        if opened is None:
            opened = cache[f] = _OpenFile.of(self.paths[f], self.schema, None if self.listed is None else self.listed[f])
        return _Read(opened, tuple(int(i) for i in local), columns, verify)

    def unverifiable(self) -> str | None:
        from batchtool.manifest import MANIFEST_NAME

        if self.listed is None:
            return f"Arrow IPC files without the {MANIFEST_NAME} that says their batches carry checksums"
        old = next((p for p, e in zip(self.paths, self.listed) if not e.checksums), None)
        return None if old is None else (f"{old}: written by a batchtool that recorded no batch checksums "
                                         "(`batchtool check` compares each file's sha256 instead)")


@dataclass(frozen=True)
class _OpenFile:
    """A shard opened once for a block of reads: its footer (one entry per batch) is parsed once, not once per
    run of batches a shuffled epoch reads from it, and checked against the manifest then. The lock keeps the
    reader to one thread at a time (a zero-copy read from the map takes microseconds)."""

    path: str
    reader: pa.ipc.RecordBatchFileReader
    lock: threading.Lock
    size: int | None
    """Bytes when mapped (a local file): each read first checks the file still has them."""
    rows: int | None

    @staticmethod
    def of(path: str, schema: pa.Schema, listed: Listed | None) -> _OpenFile:
        from batchtool.manifest import MANIFEST_NAME

        size = None if fs.is_uri(path) else _size_now(path)
        problem = size_problem(path, size, listed.bytes) if listed is not None and size is not None else None
        if problem:
            raise InputError(problem)
        reader = open_file(path)
        if listed is not None and reader.num_record_batches != listed.batches:
            raise InputError(f"{path}: {reader.num_record_batches:,} record batches, but {MANIFEST_NAME} lists "
                             f"{listed.batches:,}")
        problem = schema_problem(reader.schema, schema)
        if problem:
            raise InputError(f"{path}: schema differs from the output's ({problem})")
        return _OpenFile(path, reader, threading.Lock(), size, None if listed is None else listed.rows)

    def check_size(self) -> None:
        """The mapped file has not shrunk since it was opened: reading a page past its end would be SIGBUS."""
        if self.size is not None and _size_now(self.path) < self.size:
            raise InputError(f"{self.path}: truncated to {_size_now(self.path):,} bytes while being read "
                             f"(it had {self.size:,})")


def _size_now(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc


@dataclass(frozen=True)
class _Read(ReadTask):
    """Record batches of one file: views of its memory map when uncompressed, decompressed here otherwise."""

    file: _OpenFile
    batches: tuple[int, ...]
    columns: list[str] | None
    verify: bool = False

    def __call__(self) -> list[pa.RecordBatch]:
        opened = self.file
        with opened.lock:
            opened.check_size()
            out = [read_batch(opened.reader, opened.path, i, self.columns, self.verify) for i in self.batches]
        if opened.rows is not None:
            for i, batch in zip(self.batches, out):
                if batch.num_rows > opened.rows:
                    from batchtool.manifest import MANIFEST_NAME

                    raise InputError(f"{opened.path}, record batch {i}: {batch.num_rows:,} rows, but {MANIFEST_NAME} "
                                     f"lists {opened.rows:,} for the whole file")
        return out

    def check(self) -> None:
        self.file.check_size()


class ArrowFormat(Format):
    """Arrow IPC file format (`.arrow`): what pyarrow, polars, DuckDB and HuggingFace datasets map directly."""

    name = "arrow"
    label = "Arrow IPC"
    suffixes = (".arrow", ".ipc")
    codecs = ("none", "lz4", "zstd")
    default_codec = "none"
    magic = MAGIC
    min_batch_bytes = 24
    """The footer's entry of one record batch (offset, metadata and body lengths): bounds a manifest's count."""

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
        """The manifest's batch counts (each file's footer checked against them when it is first read), or
        each file's record batches."""
        paths = tuple(s.path for s in dataset.shards)
        entries = dataset.manifest["output"]["files"] if dataset.manifest else None
        if entries is None:
            counts = np.array([open_file(p).num_record_batches for p in paths], dtype=np.int64)
            return counts, _Batches(paths, dataset.schema, None)
        listed = tuple(Listed(e["bytes"], e["batches"], e["rows"], e.get("batch_checksums") == batch_check.CHECKSUMS)
                       for e in entries)
        return np.array([e.batches for e in listed], dtype=np.int64), _Batches(paths, dataset.schema, listed)

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int, str | None]:
        """From the batch headers: every non-empty record batch is a batch; where the output's batches carry
        CRC32Cs, every batch is read whole and verified."""
        files = output.get("files") or []
        verify = bool(files) and all(e.get("batch_checksums") == batch_check.CHECKSUMS for e in files)
        rows = batch_rows(path, verify)
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
