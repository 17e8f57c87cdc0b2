"""Arrow IPC shards: file format written (one record batch per batch, read by memory map, so an epoch of `load` only
touches pages); file and stream format read (a stream: what Hugging Face `datasets` writes), every batch's
decompressed size checked before it is decompressed (ipc_meta): against the command's budget on input, against the
largest batch the manifest records for the file when `load` reads an output."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa

from batchtool.core import budget, fs
from batchtool.io import batch_check
from batchtool.io.dataset import Reading, shard_chunk
from batchtool.core.errors import InputError, first_line, where
from batchtool.io.formats import column_types, hf, ipc_meta
from batchtool.io.formats.declared import DECLARED
from batchtool.io.formats.base import (DAMAGED, EncodedBatch, Format, ReadTask, StoredBatches, WriteOptions,
                                       check_batch_memory, open_self_describing, rows_only, schema_problem,
                                       size_problem)
from batchtool.io.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    from batchtool.io.dataset import Chunk, Dataset, ReadReport, Shard

MAGIC = ipc_meta.FILE_MAGIC


def _reader_of(source: pa.NativeFile) -> ipc_meta.ReadAt:
    """ipc_meta's view of a file: (offset, length) -> bytes."""
    return lambda at, length: source.read_at(length, at)


def _unreadable(path: str, exc: BaseException) -> InputError:
    return InputError(f"{where(path)}: not a readable Arrow IPC file ({first_line(exc)})")


def _malformed(path: str, stream: bool, exc: ipc_meta.MalformedIpc) -> InputError:
    """The one line for metadata ipc_meta cannot trust: the file and, where it is known, the batch."""
    at = where(path) if exc.batch is None else f"{where(path)}, {exc.batch}"
    return InputError(f"{at}: corrupt Arrow IPC {'stream' if stream else 'file'} ({exc})")


def open_file(path: str) -> pa.ipc.RecordBatchFileReader:
    """Open one shard of the IPC file format, memory-mapped when local, as one-line errors."""
    try:
        return pa.ipc.open_file(fs.open_random_access(path))
    except DAMAGED as exc:
        raise _unreadable(path, exc) from exc


LARGEST_BATCH = "largest_batch_bytes"
"""An output file's manifest entry: the most bytes one of its batches takes as uncompressed IPC, which no batch of the
file may declare more than before it is decompressed."""
UNRECORDED_LIMIT = budget.allowed(budget.DEFAULT_MEMORY)
"""What one batch may decompress to where the manifest does not record LARGEST_BATCH (outputs of older batchtools,
Arrow IPC files without a manifest): the share of the default --memory one batch of a run may take."""


@dataclass(frozen=True)
class BatchFile:
    """An Arrow IPC file opened to read any of its batches: pyarrow's reader, and the footer from which each batch's
    declared sizes are read (ipc_meta, O(1) a batch) and checked against `limit` before pyarrow decompresses it."""

    path: str
    reader: pa.ipc.RecordBatchFileReader
    read_at: ipc_meta.ReadAt
    footer: ipc_meta.Footer
    limit: int | None
    """The file's largest batch as the manifest records it (None: UNRECORDED_LIMIT)."""

    @staticmethod
    def open(path: str, limit: int | None = None) -> BatchFile:
        try:
            source = fs.open_random_access(path)
            reader = pa.ipc.open_file(source)
            footer = ipc_meta.file_footer(_reader_of(source), source.size())
        except DAMAGED as exc:
            raise _unreadable(path, exc) from exc
        except ipc_meta.MalformedIpc as exc:
            raise _malformed(path, False, exc) from exc
        return BatchFile(path, reader, _reader_of(source), footer, limit)

    def read(self, index: int, columns: list[str] | None, verify: bool = False) -> pa.RecordBatch:
        """Batch `index` (O(1): the footer says where it is), its compressed buffers' declared sizes checked first
        (a few bytes can declare petabytes, or really inflate to gigabytes), then checked before anything slices it
        (batch_check.check_batch: buffer sizes, offsets, null counts; O(offsets)), and with `verify`, its CRC32C.
        The commands also check every value against its type (a full pass over the data, on their worker threads)."""
        at = f"{where(self.path)}, record batch {index}"
        try:
            inflated = ipc_meta.file_inflated(self.read_at, self.footer, index)
        except ipc_meta.MalformedIpc as exc:
            raise _malformed(self.path, False, exc) from exc
        except IndexError as exc:
            raise InputError(f"{at}: corrupt (the footer lists {len(self.footer.batches):,} batches)") from exc
        limit = UNRECORDED_LIMIT if self.limit is None else self.limit
        if inflated > limit:
            of = (f"the {limit:,} of the largest batch {MANIFEST_NAME} records for the file" if self.limit is not None
                  else f"the {limit:,} allowed a batch of a file whose largest batch no {MANIFEST_NAME} records")
            raise InputError(f"{at}: corrupt (its compressed buffers declare {inflated:,} bytes decompressed, more "
                             f"than {of})")
        try:
            if verify:
                batch, metadata = self.reader.get_batch_with_custom_metadata(index)
            else:
                batch, metadata = self.reader.get_batch(index), None
        except (*DAMAGED, IndexError, pa.ArrowMemoryError) as exc:
            raise InputError(f"{at}: corrupt ({first_line(exc)})") from exc
        batch_check.check_batch(batch, self.path, index)
        if verify:
            batch_check.verify_crc(batch, metadata, self.path, index)
        return batch if columns is None else batch.select(columns)


@dataclass(frozen=True)
class IpcFile:
    """One Arrow IPC file, file or stream format, opened for reading: its schema and where its batches are (read
    from the metadata alone: nothing is decompressed to learn a batch's rows or what it inflates to)."""

    path: str
    source: pa.NativeFile
    stream: bool
    schema: pa.Schema
    layout: ipc_meta.IpcLayout

    @staticmethod
    def open(path: str) -> IpcFile:
        try:
            source = fs.open_random_access(path)
            size = source.size()
            stream = source.read_at(len(MAGIC), 0) != MAGIC
            schema = (pa.ipc.open_stream(source) if stream else pa.ipc.open_file(source)).schema
            schema.names  # (a field name that is not UTF-8 fails here, not later)
        except DAMAGED as exc:
            raise _unreadable(path, exc) from exc
        try:
            layout = (ipc_meta.stream_layout if stream else ipc_meta.file_layout)(_reader_of(source), size)
        except ipc_meta.MalformedIpc as exc:
            raise _malformed(path, stream, exc) from exc
        return IpcFile(path, source, stream, schema, layout)

    def batches(self, dataset: Dataset, columns: list[str] | None) -> Iterator[tuple[ipc_meta.Message,
                                                                                     pa.RecordBatch | None]]:
        """Each record batch's metadata and the batch (only `columns`; None when it has no rows), each checked
        against the command's budget (check_batch_memory) before it is decompressed, and again, with what its
        dictionary-encoded columns take decoded (column_types.decoded_bytes), before a worker decodes them; the
        dictionaries (which the reader keeps for the whole file) first. No data is read when `columns` is empty: the batches are their row
        counts."""
        read_at = _reader_of(self.source)
        if columns == []:
            for message in self.layout.batches:
                check_batch_memory(dataset, 0, message.rows, f"{where(self.path)}, record batch {message.index}")
                yield message, rows_only(message.rows) if message.rows else None
            return
        try:
            check_batch_memory(dataset, sum(ipc_meta.inflated(read_at, m) for m in self.layout.dictionaries), 0,
                               f"{where(self.path)}, its dictionaries")
            names = self.schema.names if columns is None else columns
            included = [self.schema.get_field_index(c) for c in names]
            reader = self._reader(pa.ipc.IpcReadOptions(included_fields=sorted(included)))
            encoded = [n for n in names if column_types.holds_dictionary(self.schema.field(n).type)]
            for message in self.layout.batches:
                kept = ipc_meta.field_buffers(self.schema, message, names)
                at = f"{where(self.path)}, record batch {message.index}"
                inflated = ipc_meta.inflated(read_at, message, kept)
                check_batch_memory(dataset, inflated, message.rows, at)
                batch = self._read(reader, message.index)
                if encoded:
                    decoded = sum(column_types.decoded_bytes(batch.column(n)) for n in encoded)
                    check_batch_memory(dataset, inflated, message.rows, at, decoded)
                yield message, (batch.select(names) if message.rows else None)
        except ipc_meta.MalformedIpc as exc:
            raise _malformed(self.path, self.stream, exc) from exc

    def _reader(self, options: pa.ipc.IpcReadOptions) -> pa.ipc.RecordBatchFileReader | pa.ipc.RecordBatchStreamReader:
        try:
            if self.stream:
                self.source.seek(0)
                return pa.ipc.open_stream(self.source, options=options)
            return pa.ipc.open_file(self.source, options=options)
        except DAMAGED as exc:
            raise _unreadable(self.path, exc) from exc

    def _read(self, reader: pa.ipc.RecordBatchFileReader | pa.ipc.RecordBatchStreamReader,
              index: int) -> pa.RecordBatch:
        """The next batch of a stream, or batch `index` of a file, checked before anything slices it
        (batch_check.check_batch, naming the column)."""
        try:
            batch = reader.read_next_batch() if self.stream else reader.get_batch(index)
        except (*DAMAGED, StopIteration, pa.ArrowMemoryError) as exc:
            raise InputError(f"{where(self.path)}, record batch {index}: corrupt ({first_line(exc)})") from exc
        batch_check.check_batch(batch, self.path, index)
        return batch


def batch_rows(path: str, verify: bool = False, limit: int | None = None) -> list[int]:
    """Rows of each batch of a file, from its metadata (nothing is decompressed), or with `verify`, each batch read
    whole (none decompressing to more than `limit`: BatchFile) and its CRC32C checked."""
    if not verify:
        return [m.rows for m in IpcFile.open(path).layout.batches]
    file = BatchFile.open(path, limit)
    return [file.read(i, None, True).num_rows for i in range(file.reader.num_record_batches)]


class _Sink:
    """An Arrow IPC file: one record batch per batch, buffers compressed with `codec` (or not)."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, codec: str) -> None:
        options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
        self._writer = pa.ipc.new_file(file, schema, options=options)
        self._largest = 0

    def write(self, encoded: EncodedBatch) -> None:
        """Each record batch carries the CRC32C of its buffers (Arrow IPC has no checksum of its own), which
        encode computed. The largest batch's size as uncompressed IPC (its buffers as the writer lays them out: what
        their compressed forms declare, padded, and the message; a function of the bytes written, so of the data
        alone) bounds what reading one may decompress to (LARGEST_BATCH)."""
        self._writer.write_batch(encoded.data, custom_metadata=encoded.metadata)
        self._largest = max(self._largest, pa.ipc.get_record_batch_size(encoded.data))

    def close(self) -> dict:
        self._writer.close()
        return {"batch_checksums": batch_check.CHECKSUMS, LARGEST_BATCH: self._largest}

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
        batch = self.batch
        try:
            batch.validate(full=True)
        except DAMAGED as exc:
            raise InputError(f"{where(self.shard.path)}, record batch {self.index}: corrupt ({first_line(exc)})") \
                from exc
        return shard_chunk(batch, self.schema, self.shard, self.first_row)


@dataclass(frozen=True)
class Listed:
    """What the manifest says of one file, checked when the file is opened: its size, batches and rows, whether
    its batches carry CRC32Cs (outputs of older batchtools do not), and its largest batch in memory (None: not
    recorded)."""

    bytes: int
    batches: int
    rows: int
    checksums: bool
    largest: int | None

    @staticmethod
    def of(entry: dict) -> Listed:
        return Listed(entry["bytes"], entry["batches"], entry["rows"],
                      entry.get("batch_checksums") == batch_check.CHECKSUMS, largest_batch(entry))


def largest_batch(entry: dict) -> int | None:
    """An output file's recorded LARGEST_BATCH, None where there is none (or it is not a size)."""
    value = entry.get(LARGEST_BATCH)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


INLINE_VERIFIED_BYTES = 1 << 20
"""Batches of a memory-mapped output that average at most this many bytes are read and verified on the consuming
thread: their CRC32C (google-crc32c releases the GIL, about 0.2 ms a MB) costs less than what handing them to
reading threads adds in GIL hand-offs. Measured on 2 cores, first epoch (every batch verified), every column to
NumPy and touched: segment's 53 KB batches 1.98 s on the loop against 2.77-3.60 s on threads; bucket's 380 KB ones
0.77 against 0.92 s; 1.6 MB ones even (0.55 and 0.54 s); 6 MB ones 0.50 against 0.43 s."""


@dataclass(frozen=True)
class _Batches(StoredBatches):
    """Record batch i is batch i, found through the file's footer (parsed when the file is first read)."""

    unsliced = True

    paths: tuple[str, ...]
    schema: pa.Schema
    listed: tuple[Listed, ...] | None
    """From the manifest; None for Arrow files without one."""
    mapped: bool = False
    """The manifest says the files are uncompressed and they are local: every read is a view of a memory map."""

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        return np.asarray(batch_rows(self.paths[f]), dtype=np.int64)[local]

    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict, verify: bool = False) -> _Read:
        opened = cache.get(f)
        if opened is None:
            opened = cache[f] = _OpenFile.of(self.paths[f], self.schema, None if self.listed is None else self.listed[f])
        return _Read(opened, tuple(int(i) for i in local), columns, verify)

    def in_place(self, verify: bool = False) -> bool:
        """Verified too where the batches average at most INLINE_VERIFIED_BYTES (mapped: the manifest lists the
        files)."""
        if not (self.mapped and verify and self.listed):
            return self.mapped
        stored = sum(entry.bytes for entry in self.listed)
        return stored <= INLINE_VERIFIED_BYTES * max(1, sum(entry.batches for entry in self.listed))

    def unverifiable(self) -> str | None:
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
    file: BatchFile
    lock: threading.Lock
    descriptor: int | None
    """When mapped (a local file): the file, opened before the map and closed with this object, whose size
    (fstat, a fraction of a microsecond: it is checked before every batch is handed out) is the mapped file's
    even if another file is renamed over its path."""
    size: int | None
    """Bytes when mapped: each read first checks the file still has them."""
    rows: int | None

    @staticmethod
    def of(path: str, schema: pa.Schema, listed: Listed | None) -> _OpenFile:
        descriptor = None if fs.is_uri(path) else _open_descriptor(path)
        try:
            opened = _OpenFile._checked(path, schema, listed, descriptor)
        except BaseException:
            if descriptor is not None:
                os.close(descriptor)
            raise
        if descriptor is not None:
            weakref.finalize(opened, os.close, descriptor)
        return opened

    @staticmethod
    def _checked(path: str, schema: pa.Schema, listed: Listed | None, descriptor: int | None) -> _OpenFile:
        size = None if descriptor is None else _stat_now(path, descriptor).st_size
        problem = size_problem(path, size, listed.bytes) if listed is not None and size is not None else None
        if problem:
            raise InputError(problem)
        file = BatchFile.open(path, None if listed is None else listed.largest)
        reader = file.reader
        if listed is not None and reader.num_record_batches != listed.batches:
            raise InputError(f"{path}: {reader.num_record_batches:,} record batches, but {MANIFEST_NAME} lists "
                             f"{listed.batches:,}")
        problem = schema_problem(reader.schema, schema)
        if problem:
            raise InputError(f"{path}: schema differs from the output's ({problem})")
        return _OpenFile(path, file, threading.Lock(), descriptor, size, None if listed is None else listed.rows)

    def check_size(self) -> np.ndarray | None:
        """The mapped file has not shrunk since it was opened (reading a page past its end would be SIGBUS); which of
        its batches this process has verified as the file is now (None: not a local file, verify every read)."""
        if self.descriptor is None:
            return None
        now = _stat_now(self.path, self.descriptor)
        if now.st_size < self.size:
            raise InputError(f"{self.path}: truncated to {now.st_size:,} bytes while being read (it had "
                             f"{self.size:,})")
        return _verified(now, self.file.reader.num_record_batches)


def _open_descriptor(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _stat_now(path: str, descriptor: int) -> os.stat_result:
    try:
        return os.fstat(descriptor)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc


_VERIFIED: dict[tuple[int, ...], np.ndarray] = {}
"""For each local file this process has read batches of, as it is (device, inode, size, modification and change
times), which batches' CRC32C matched: a batch is verified the first time the process reads it, not again every
epoch, since the memory map then holds the bytes that matched. A file written in place gets new times, so a new
entry, and its batches are verified again."""
_VERIFIED_LOCK = threading.Lock()


def _verified(stat: os.stat_result, batches: int) -> np.ndarray:
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    with _VERIFIED_LOCK:
        found = _VERIFIED.get(key)
        if found is None:
            found = _VERIFIED[key] = np.zeros(batches, dtype=bool)
        return found


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
            verified = opened.check_size()
            out = []
            for i in self.batches:
                unverified = self.verify and (verified is None or not verified[i])
                out.append(opened.file.read(i, self.columns, unverified))
                if unverified and verified is not None:
                    verified[i] = True
        if opened.rows is not None:
            for i, batch in zip(self.batches, out):
                if batch.num_rows > opened.rows:
                    raise InputError(f"{opened.path}, record batch {i}: {batch.num_rows:,} rows, but {MANIFEST_NAME} "
                                     f"lists {opened.rows:,} for the whole file")
        return out

    def check(self) -> None:
        self.file.check_size()


def _has_bitmap(array: pa.Array) -> bool:
    """Whether the array or a child holds a bitmap the IPC writer stores (boolean values; a validity bitmap, which it
    leaves out where there is no null), whose bits past the array's end are whatever the array was cut from."""
    if pa.types.is_boolean(array.type) or array.null_count:
        return True
    if isinstance(array, pa.ExtensionArray):
        return _has_bitmap(array.storage)
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        return _has_bitmap(array.values)
    if isinstance(array, pa.StructArray):
        return any(_has_bitmap(array.field(i)) for i in range(array.type.num_fields))
    return False


class ArrowFormat(Format, declared=DECLARED["arrow"]):
    """Arrow IPC (`.arrow`): the file format written, which pyarrow, polars, DuckDB and Hugging Face datasets map
    directly; the file and the stream format read."""

    min_batch_bytes = 24
    """The footer's entry of one record batch (offset, metadata and body lengths): bounds a manifest's count."""
    magic = MAGIC
    group = "record batch"

    def detect(self, path: str, head: bytes | None = None) -> bool:
        """By name, or by the file format's magic or a stream's first message (its continuation marker)."""
        return super().detect(path, head) or (head is not None and head.startswith(ipc_meta.CONTINUATION))

    def directory_files(self, src: str) -> list[str] | None:
        """A Hugging Face `datasets` save_to_disk directory's stream files, in its state.json's order."""
        return hf.split_files(src)

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: WriteOptions) -> _Sink:
        return _Sink(file, schema, options.codec)

    def encode(self, batch: pa.RecordBatch, options: WriteOptions) -> EncodedBatch:
        """The IPC writer stores a sliced column's whole buffers (a string column sliced at offset 0 keeps
        its parent's values), and a bitmap's last byte whole (a boolean or validity bitmap cut mid-byte keeps its
        parent's next bits): such columns are copied compact, whose bitmaps end in zero bits, so the bytes depend
        on the values only, not on how the batch was cut (key ranges, --memory, --threads, the engine). A column
        the writer sends whole (batch_check.written_buffers) is already compact and is not copied. Its CRC32C is
        computed here too, on the worker that encodes it, from the buffers the writer sends."""
        columns, buffers, copied = [], [], False
        for column in batch.columns:
            bitmap = _has_bitmap(column)
            written = None if bitmap else batch_check.written_buffers(column)
            if written is None and (bitmap or column.get_total_buffer_size() > column.nbytes):
                column = pa.concat_arrays([column])
                written = batch_check.written_buffers(column)
                copied = True
            columns.append(column)
            buffers.append(written)
        compact = pa.RecordBatch.from_arrays(columns, schema=batch.schema) if copied else batch
        return EncodedBatch(compact, metadata=batch_check.batch_crc_metadata(compact, buffers, columns))

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: Reading) -> Dataset:
        """Each file's schema and rows from its metadata: nothing is decompressed."""
        def footer(path: str) -> tuple[pa.Schema, int]:
            opened = IpcFile.open(path)
            return opened.schema, opened.layout.rows

        return open_self_describing(src, self, shards, schema, manifest, footer, reading)

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
        listed = tuple(Listed.of(e) for e in entries)
        mapped = dataset.manifest["output"].get("compression") == "none" and not any(map(fs.is_uri, paths))
        return np.array([e.batches for e in listed], dtype=np.int64), _Batches(paths, dataset.schema, listed, mapped)

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int, str | None]:
        """From the metadata: every non-empty record batch is a batch; where the output's batches carry CRC32Cs,
        every batch is read whole and verified."""
        files = output.get("files") or []
        verify = bool(files) and all(e.get("batch_checksums") == batch_check.CHECKSUMS for e in files)
        opened = IpcFile.open(path)
        recorded = [largest_batch(e) for e in files]
        limit = None if None in recorded or not recorded else max(recorded)
        rows = batch_rows(path, True, limit) if verify else [m.rows for m in opened.layout.batches]
        return sum(rows), sum(1 for r in rows if r), schema_problem(opened.schema, schema)

    def tasks(self, dataset: Dataset, columns: list[str] | None, report: ReadReport) -> Iterator[_Task]:
        schema = dataset.projected_schema(columns)
        for shard in dataset.shards:
            first = 0
            for message, batch in IpcFile.open(shard.path).batches(dataset, columns):
                if batch is not None:
                    yield _Task(shard, message.index, first, batch, schema)
                first += message.rows


FORMAT = ArrowFormat()
"""The format, as the registry (batchtool.io.formats.registry.FORMATS) lists it."""
