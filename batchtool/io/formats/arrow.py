"""Arrow IPC shards: file format written (one record batch per batch, or per stack of batches, read by memory map, so
an epoch of `load` only touches pages); file and stream format read (a stream: what Hugging Face `datasets` writes;
the files opened by arrow_files)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa

from batchtool.core import fs
from batchtool.io import batch_check
from batchtool.io.dataset import Reading, shard_chunk
from batchtool.core.errors import InputError, first_line, where
from batchtool.io.formats import hf, ipc_meta
from batchtool.io.formats.declared import DECLARED
from batchtool.io.formats.arrow_files import (LARGEST_BATCH, MAGIC, BatchFile, IpcFile, batch_rows, malformed,
                                              open_file)
from batchtool.io.formats.base import (DAMAGED, EncodedBatch, Format, Piece, ReadTask, Stacked, StoredBatches,
                                       WriteOptions, open_self_describing, schema_problem, size_problem)
from batchtool.io.manifest import MANIFEST_NAME, STACKED_ROWS

if TYPE_CHECKING:
    from batchtool.io.dataset import Chunk, Dataset, ReadReport, Shard


RECORD_BATCHES = "record_batches"
"""A stacked output file's manifest entry (STACKED_ROWS): the record batches holding its batches."""


def stacked_starts(path: str, rows: list[int], stacked: int) -> np.ndarray:
    """Where each record batch's batches start among the file's, and their count at the end, from each record
    batch's `rows`, which must be a whole number of `stacked`-row batches (STACKED_ROWS)."""
    counts = np.asarray(rows, dtype=np.int64)
    bad = np.flatnonzero((counts % stacked != 0) | (counts == 0))
    if len(bad):
        raise InputError(f"{path}, record batch {int(bad[0])}: {int(counts[bad[0]]):,} rows, not a whole number of the "
                         f"{stacked:,}-row batches {MANIFEST_NAME} says its record batches hold")
    return np.concatenate([[0], np.cumsum(counts // stacked)]).astype(np.int64)


class _Sink:
    """An Arrow IPC file: one record batch per batch, or per stack of them (OutputOptions.stacked_rows), buffers
    compressed with `codec` (or not)."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, codec: str, stacked: bool) -> None:
        options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
        self._writer = pa.ipc.new_file(file, schema, options=options)
        self._largest = 0
        self._stacked = stacked
        self._count = 0

    def write(self, encoded: EncodedBatch) -> None:
        """Each record batch carries the CRC32C of its buffers (Arrow IPC has no checksum of its own), which
        encode computed. The largest batch's size as uncompressed IPC (its buffers as the writer lays them out: what
        their compressed forms declare, padded, and the message; a function of the bytes written, so of the data
        alone) bounds what reading one may decompress to (LARGEST_BATCH)."""
        self._writer.write_batch(encoded.data, custom_metadata=encoded.metadata)
        self._largest = max(self._largest, pa.ipc.get_record_batch_size(encoded.data))
        self._count += 1

    def close(self) -> dict:
        self._writer.close()
        return {"batch_checksums": batch_check.CHECKSUMS, LARGEST_BATCH: self._largest,
                **({RECORD_BATCHES: self._count} if self._stacked else {})}

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
    stacked: int | None = None
    """Rows of every batch, where each record batch holds rows / stacked of them (STACKED_ROWS)."""
    record_batches: int | None = None
    """Where stacked: the record batches the manifest lists (None: not recorded)."""

    @staticmethod
    def of(entry: dict, stacked: int | None = None) -> Listed:
        count = entry.get(RECORD_BATCHES) if stacked else None
        return Listed(entry["bytes"], entry["batches"], entry["rows"],
                      entry.get("batch_checksums") == batch_check.CHECKSUMS, largest_batch(entry), stacked,
                      count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None)



def largest_batch(entry: dict) -> int | None:
    """An output file's recorded LARGEST_BATCH, None where there is none (or it is not a size)."""
    value = entry.get(LARGEST_BATCH)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


INLINE_VERIFIED_BYTES = 1 << 20
"""Batches of a memory-mapped output that average at most this many bytes are read and verified on the consuming
thread: their CRC32C (google-crc32c releases the GIL, about 0.2 ms a MB) costs less than what handing them to
reading threads adds in GIL hand-offs. Measured on 2 cores, first epoch (every batch verified), every column to
NumPy and touched: segment's 53 KB batches 1.98 s on the loop against 2.77-3.60 s on threads; bucket's 380 KB ones
0.77 against 0.92 s; 1.6 MB ones even (0.55 and 0.54 s); 6 MB ones 0.50 against 0.43 s. Batches, not record
batches: segment's stacks of 64 such batches (3.3 MB a record batch) are read 1.43 s on the loop against 1.97 s on
threads, whose GIL the loop's check of each batch waits for."""


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

    @property
    def stacked(self) -> int | None:
        return None if not self.listed else self.listed[0].stacked

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        if self.stacked:
            return np.full(len(local), self.stacked, dtype=np.int64)
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
    stacked: int | None = None
    """Rows of each batch where each record batch holds several (Listed.stacked)."""
    starts: np.ndarray | None = None
    """Where stacked: the first batch of each record batch, then the file's batch count."""

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
        starts = None if listed is None or not listed.stacked else _stacks(file, listed)
        batches = reader.num_record_batches if starts is None else int(starts[-1])
        if listed is not None and batches != listed.batches:
            raise InputError(f"{path}: {batches:,} {'batches' if starts is not None else 'record batches'}, but "
                             f"{MANIFEST_NAME} lists {listed.batches:,}")
        problem = schema_problem(reader.schema, schema)
        if problem:
            raise InputError(f"{path}: schema differs from the output's ({problem})")
        return _OpenFile(path, file, threading.Lock(), descriptor, size, None if listed is None else listed.rows,
                         None if starts is None else listed.stacked, starts)

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


def _stacks(file: BatchFile, listed: Listed) -> np.ndarray:
    """A stacked file's stacked_starts, from its record batches' headers (and their count the manifest's)."""
    count = len(file.footer.batches)
    if listed.record_batches is not None and count != listed.record_batches:
        raise InputError(f"{file.path}: {count:,} record batches, but {MANIFEST_NAME} lists {listed.record_batches:,}")
    try:
        rows = [ipc_meta.file_message(file.read_at, file.footer, i).rows for i in range(count)]
    except ipc_meta.MalformedIpc as exc:
        raise malformed(file.path, False, exc) from exc
    return stacked_starts(file.path, rows, listed.stacked)


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
    """Batches of one file: views of its memory map when uncompressed, decompressed here otherwise."""

    file: _OpenFile
    batches: tuple[int, ...]
    columns: list[str] | None
    verify: bool = False

    def __call__(self) -> list[Piece]:
        """The batches, each record batch read once (a stacked file's batches are Stacked pieces of theirs)."""
        opened = self.file
        starts = opened.starts
        records = self.batches if starts is None else \
            (np.searchsorted(starts, self.batches, side="right") - 1).tolist()
        read: dict[int, pa.RecordBatch] = {}
        with opened.lock:
            verified = opened.check_size()
            for r in records:
                if r not in read:
                    unverified = self.verify and (verified is None or not verified[r])
                    read[r] = opened.file.read(r, self.columns, unverified)
                    if unverified and verified is not None:
                        verified[r] = True
        if opened.rows is not None:
            for r, batch in read.items():
                if batch.num_rows > opened.rows:
                    raise InputError(f"{opened.path}, record batch {r}: {batch.num_rows:,} rows, but {MANIFEST_NAME} "
                                     f"lists {opened.rows:,} for the whole file")
        if starts is None:
            return [read[r] for r in records]
        return [Stacked(read[r], i - int(starts[r]), opened.stacked, opened, r) for i, r in zip(self.batches, records)]

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

    stores_stacks = True

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: WriteOptions) -> _Sink:
        return _Sink(file, schema, options.codec, bool(options.stacked_rows))

    def recorded_output(self, options: WriteOptions) -> dict[str, Any]:
        """STACKED_ROWS where each record batch holds several batches."""
        recorded = super().recorded_output(options)
        return {**recorded, STACKED_ROWS: options.stacked_rows} if options.stacked_rows else recorded

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
        listed = tuple(Listed.of(e, dataset.manifest["output"].get(STACKED_ROWS)) for e in entries)
        mapped = dataset.manifest["output"].get("compression") == "none" and not any(map(fs.is_uri, paths))
        return np.array([e.batches for e in listed], dtype=np.int64), _Batches(paths, dataset.schema, listed, mapped)

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int, str | None]:
        """From the metadata: every non-empty record batch is a batch, or where stacked (STACKED_ROWS) holds rows /
        stacked of them; where the output's batches carry CRC32Cs, every record batch is read whole and verified."""
        files = output.get("files") or []
        verify = bool(files) and all(e.get("batch_checksums") == batch_check.CHECKSUMS for e in files)
        opened = IpcFile.open(path)
        recorded = [largest_batch(e) for e in files]
        limit = None if None in recorded or not recorded else max(recorded)
        rows = batch_rows(path, True, limit) if verify else [m.rows for m in opened.layout.batches]
        stacked = output.get(STACKED_ROWS)
        batches = int(stacked_starts(path, rows, stacked)[-1]) if stacked else sum(1 for r in rows if r)
        return sum(rows), batches, schema_problem(opened.schema, schema)

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
