"""TFRecord framing (length, masked CRC32C, payload) read and written without TensorFlow."""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import BinaryIO

import google_crc32c

from batchtool import fs
from batchtool.errors import CorruptRecordError, InputError, UsageError, where

OnCorrupt = Callable[[CorruptRecordError], None]
Stream = BinaryIO | gzip.GzipFile

_GZIP_MAGIC = b"\x1f\x8b"
_HEADER_SIZE = 12
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8
_MAX_SINGLE_READ = 1 << 26
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def masked_crc(data: bytes) -> int:
    """CRC32C of data, masked as TFRecord stores it (so CRCs of CRCs do not degenerate)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _header_is_valid(header: bytes) -> bool:
    """True if 12 bytes form a TFRecord header whose length CRC checks out."""
    return len(header) == _HEADER_SIZE and masked_crc(header[:8]) == _U32.unpack_from(header, 8)[0]


def _open_input(path: str) -> BinaryIO:
    """The file opened for buffered reading; a missing or unreadable file is an InputError."""
    try:
        return fs.open_input(path, sequential=True)
    except OSError as exc:
        raise InputError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None


def detect_compression(path: str) -> str | None:
    """'GZIP' if the file is a gzip stream, else None.

    A file starting with the gzip magic whose first 12 bytes are also a valid
    uncompressed record header (length CRC matches) is uncompressed: the magic
    alone can be the low bytes of a first record of 35,615+ bytes.
    """
    with _open_input(path) as f:
        head = f.read(_HEADER_SIZE)
    if head[:2] != _GZIP_MAGIC or _header_is_valid(head):
        return None
    return "GZIP"


def _resolve_compression(path: str, compression: str | None) -> str | None:
    """Turn 'auto' / None / 'gzip' into None or 'GZIP'; anything else is a usage error."""
    if compression == "auto":
        return detect_compression(path)
    if not compression:
        return None
    if compression.upper() == "GZIP":
        return "GZIP"
    raise UsageError(f"{path}: unsupported TFRecord compression {compression!r}; expected 'auto', None or 'GZIP'")


class _Reader:
    """Reads one file's records in order, turning framing problems into CorruptRecordError."""

    def __init__(self, path: str, stream: Stream, compressed: bool) -> None:
        self.path = path
        self.stream = stream
        self.offset_note = " of the decompressed stream" if compressed else ""
        self.index = 0
        self.offset = 0

    def error(self, message: str) -> CorruptRecordError:
        """An error naming the file, the current record and its byte offset."""
        return CorruptRecordError(
            f"{where(self.path, record=self.index)}: {message} (record starts at byte offset "
            f"{self.offset}{self.offset_note})")

    def read(self, size: int) -> bytes:
        """Up to size bytes; large sizes are read in pieces so a bogus length cannot exhaust memory."""
        try:
            if size <= _MAX_SINGLE_READ:
                return self.stream.read(size)
            pieces = []
            while size > 0:
                piece = self.stream.read(min(size, _MAX_SINGLE_READ))
                if not piece:
                    break
                pieces.append(piece)
                size -= len(piece)
            return b"".join(pieces)
        except _GZIP_ERRORS as exc:
            raise self.error(f"corrupt gzip stream: {exc}") from exc

    def next(self) -> tuple[bytes, CorruptRecordError | None] | None:
        """The next payload and, if its data CRC is wrong, the error; None at a clean end of file.

        Framing errors that lose synchronisation (truncation, bad length CRC, bad gzip) raise.
        """
        header = self.read(_HEADER_SIZE)
        if not header:
            return None
        if len(header) < _HEADER_SIZE:
            raise self.error(f"truncated: needs {_HEADER_SIZE} header bytes, {len(header)} left")
        (length,) = _U64.unpack_from(header)
        stored, computed = _U32.unpack_from(header, 8)[0], masked_crc(header[:8])
        if stored != computed:
            raise self.error(f"length CRC mismatch: stored 0x{stored:08x}, expected 0x{computed:08x}")
        data = self.read(length)
        footer = self.read(4) if len(data) == length else b""
        if len(footer) < 4:
            raise self.error(f"truncated: needs {length + 4} bytes ({length} data + 4 CRC), "
                             f"{len(data) + len(footer)} left")
        (stored,) = _U32.unpack(footer)
        computed = masked_crc(data)
        bad = None
        if stored != computed:
            bad = self.error(f"data CRC mismatch: stored 0x{stored:08x}, expected 0x{computed:08x} "
                             f"for {length} bytes of data")
        self.index += 1
        self.offset += _HEADER_SIZE + length + 4
        return data, bad


def _iter_indexed(path: str, compression: str | None, skip_corrupt: bool,
                  on_corrupt: OnCorrupt | None) -> Iterator[tuple[int, bytes]]:
    """(record index, payload) pairs; the index counts skipped records too, so it is the position in the file."""

    def report(err: CorruptRecordError) -> None:
        if not skip_corrupt:
            raise err
        if on_corrupt is not None:
            on_corrupt(err)

    compressed = _resolve_compression(path, compression) == "GZIP"
    with _open_input(path) as raw, gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw as stream:
        reader = _Reader(path, stream, compressed)
        while True:
            index = reader.index
            try:
                record = reader.next()
            except CorruptRecordError as err:
                report(err)
                return
            if record is None:
                return
            data, bad = record
            if bad is None:
                yield index, data
            else:
                report(bad)


def iter_records(path: str, *, compression: str | None = "auto", skip_corrupt: bool = False,
                 on_corrupt: OnCorrupt | None = None) -> Iterator[bytes]:
    """Stream the payloads of one TFRecord file, verifying both CRCs of every record.

    With skip_corrupt, a record whose data CRC is wrong is reported to on_corrupt
    and skipped; a bad length CRC, truncation or corrupt gzip stream is reported
    and ends the file, since the next record boundary cannot be found.
    """
    for _, data in _iter_indexed(path, compression, skip_corrupt, on_corrupt):
        yield data


def iter_record_chunks(path: str, chunk_records: int, *, compression: str | None = "auto",
                       skip_corrupt: bool = False, on_corrupt: OnCorrupt | None = None,
                       ) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (index of the chunk's first record, payloads) so decoding can run on worker threads.

    Records in a chunk are consecutive in the file: a skipped corrupt record
    ends the chunk early, so first_index + i is always record i's true index.
    """
    if chunk_records < 1:
        raise UsageError(f"chunk_records must be at least 1, got {chunk_records}")
    first = 0
    chunk: list[bytes] = []
    for index, data in _iter_indexed(path, compression, skip_corrupt, on_corrupt):
        if chunk and (index != first + len(chunk) or len(chunk) == chunk_records):
            yield first, chunk
            chunk = []
        if not chunk:
            first = index
        chunk.append(data)
    if chunk:
        yield first, chunk


class RangeReader:
    """The records of byte ranges of one file, for reading batches by an index; both CRCs verified.

    Offsets are in the uncompressed record stream. An uncompressed file is read with one seek and
    one read per range; a GZIP stream cannot be entered in the middle, so a range is reached by
    decompressing forward from the last one (cheap when ranges come in file order), and a backward
    jump decompresses from the start of the file again.
    """

    def __init__(self, path: str, compression: str | None = "auto") -> None:
        self.path = path
        self.compressed = _resolve_compression(path, compression) == "GZIP"
        try:
            self._raw: BinaryIO = fs.open_input(path) if self.compressed or fs.is_uri(path) else open(path, "rb", 0)
        except OSError as exc:
            raise InputError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.compressed else None
        self._size = None if self.compressed else fs.file_size(path)

    def records(self, start: int, end: int, first_record: int) -> list[bytes]:
        """Payloads of the records in [start, end); errors name records counting from first_record."""
        if self._gzip is not None:
            try:
                self._gzip.seek(start)
            except _GZIP_ERRORS as exc:
                raise CorruptRecordError(f"{self.path}: corrupt gzip stream before byte {start} "
                                         f"of the decompressed stream: {exc}") from exc
            stream: Stream = self._gzip
        else:
            if end > self._size:
                raise CorruptRecordError(f"{self.path}: {self._size} bytes, but a batch ends at byte {end}")
            self._raw.seek(start)
            stream = io.BytesIO(self._raw.read(end - start))
        reader = _Reader(self.path, stream, self.compressed)
        reader.index, reader.offset = first_record, start
        payloads = []
        while reader.offset < end:
            record = reader.next()
            if record is None:
                raise reader.error(f"the file ends before byte {end}, where this batch ends")
            data, bad = record
            if bad is not None:
                raise bad
            payloads.append(data)
        if reader.offset != end:
            raise reader.error(f"a record crosses byte {end}, where this batch ends")
        return payloads

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        self._raw.close()


def frame_record(payload: bytes) -> bytes:
    """One payload framed as a TFRecord record."""
    return frame_records((payload,))


def frame_records(payloads: Iterable[bytes]) -> bytes:
    """Many payloads framed back to back, built with one join."""
    parts: list[bytes] = []
    for payload in payloads:
        length = _U64.pack(len(payload))
        parts += (length, _U32.pack(masked_crc(length)), payload, _U32.pack(masked_crc(payload)))
    return b"".join(parts)


class TFRecordFileWriter:
    """Writes framed records to one file, optionally GZIP-compressed.

    GZIP output has no file name and a zero mtime in its header, so the same
    records always give the same bytes. bytes_written counts framed
    (uncompressed) bytes; stat the file for its size on disk.
    """

    def __init__(self, path: str, compression: str | None = None) -> None:
        self.path = path
        self.records = 0
        self.bytes_written = 0
        self._raw: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._stream: Stream = self._raw
        if compression and compression.upper() == "GZIP":
            self._stream = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=6, mtime=0)
        elif compression:
            self._raw.close()
            raise UsageError(f"{path}: unsupported TFRecord compression {compression!r}; expected None or 'GZIP'")

    def write(self, payload: bytes) -> None:
        """Append one record."""
        self.write_many((payload,))

    def write_many(self, payloads: Iterable[bytes]) -> None:
        """Append many records with a single write."""
        payloads = list(payloads)
        framed = frame_records(payloads)
        self._stream.write(framed)
        self.records += len(payloads)
        self.bytes_written += len(framed)

    def close(self) -> None:
        """Flush and close (also ends the gzip stream); safe to call twice."""
        if self._stream is not self._raw:
            self._stream.close()
        self._raw.close()

    def __enter__(self) -> TFRecordFileWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
