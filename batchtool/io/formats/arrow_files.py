"""Arrow IPC files opened to read: a file's record batches by index (BatchFile), a file or stream with the layout of
its batches (IpcFile), every batch's decompressed size checked before it is decompressed (ipc_meta): against the
command's budget on input, against the largest batch the manifest records for the file when `load` reads an
output."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from batchtool.core import budget, fs
from batchtool.core.errors import InputError, first_line, where
from batchtool.io import batch_check
from batchtool.io.formats import column_types, ipc_meta
from batchtool.io.formats.base import DAMAGED, check_batch_memory, rows_only
from batchtool.io.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    from batchtool.io.dataset import Dataset

MAGIC = ipc_meta.FILE_MAGIC


def _reader_of(source: pa.NativeFile) -> ipc_meta.ReadAt:
    """ipc_meta's view of a file: (offset, length) -> bytes."""
    return lambda at, length: source.read_at(length, at)


def _unreadable(path: str, exc: BaseException) -> InputError:
    return InputError(f"{where(path)}: not a readable Arrow IPC file ({first_line(exc)})")


def malformed(path: str, stream: bool, exc: ipc_meta.MalformedIpc) -> InputError:
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
            raise malformed(path, False, exc) from exc
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
            raise malformed(self.path, False, exc) from exc
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
            raise malformed(path, stream, exc) from exc
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
            raise malformed(self.path, self.stream, exc) from exc

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

