"""A TFRecord file's records read in order, both CRCs verified; with --skip-corrupt, what is damaged is stepped over
(resynchronising on the next record whose CRCs check out) and counted exactly. Records one by one, in chunks, as the
byte spans of chunks (for read tasks that read their own), and by byte ranges (for an index)."""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from batchtool.core import fs
from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES
from batchtool.core.errors import BatchtoolError, CorruptRecordError, InputError, UsageError, where
from batchtool.io.dataset import Skipped
from batchtool.io.formats.tfrecord.framing import FRAMING, HEADER_SIZE, U32, U64, masked_crc, valid_headers
from batchtool.io.formats.tfrecord.stream import (BLOCK, INDEX_BLOCK, REMOTE_INDEX_BLOCK, GzipCorrupt, RecordStream,
                                              open_record_file, resolve_compression)


OnCorrupt = Callable[[Skipped], None]


def _resynchronise(source: RecordStream, seen: bytes, limit: int) -> tuple[int | None, int]:
    """Find the next record after lost framing: (its stream offset, or None at the end; records passed).

    `seen` are the bytes already read past the bad record's first byte. The scan moves one
    byte at a time (every offset is tested at once, a block at a time), and a record is
    trusted only when its length CRC and its data CRC both check out, so a chance match of
    the length CRC (one offset in 2**32) is not taken for a boundary. Headers that pass the
    length CRC alone are counted as records passed: real records whose data is damaged. On
    success the bytes from the found record on are pushed back into the source. The window
    never holds more than about twice the record limit. (A header claiming more than the limit
    is not a boundary, and not counted: no such record could have been read.)
    """
    window, pos = seen, 0  # window[pos:] is not scanned yet; window[0] is at stream offset `base`
    base = source.offset - len(seen)
    passed = 0
    ended = False
    while True:
        if not ended and len(window) - pos < BLOCK + HEADER_SIZE:
            more = source.read(BLOCK)
            ended = len(more) < BLOCK
            window, base, pos = window[pos:] + more, base + pos, 0
        stop = min(len(window), pos + BLOCK + HEADER_SIZE - 1)
        for at in (valid_headers(memoryview(window)[pos:stop], limit) + pos).tolist():
            (length,) = U64.unpack_from(window, at)
            end = at + HEADER_SIZE + length + 4
            if len(window) < end and not ended:
                wanted = max(end - len(window), len(window))  # grow geometrically: few copies
                more = source.read(wanted)
                ended = len(more) < wanted
                window += more
            if len(window) >= end:
                stored = U32.unpack_from(window, end - 4)[0]
                if masked_crc(window[at + HEADER_SIZE:end - 4]) == stored:
                    source.unread(window[at:])
                    return base + at, passed
            passed += 1
        pos = max(pos, stop - HEADER_SIZE + 1)
        if ended and len(window) - pos < HEADER_SIZE:
            return None, passed


class _Reader:
    """Reads one file's records in order, verifying both CRCs; with skip_corrupt, steps over what is
    damaged and reports exactly what that cost."""

    def __init__(self, path: str, source: RecordStream, compressed: bool, limit: int, skip_corrupt: bool,
                 on_corrupt: OnCorrupt | None) -> None:
        self.path = path
        self.source = source
        self.offset_note = " of the decompressed stream" if compressed else ""
        self.limit = limit
        self.skip_corrupt = skip_corrupt
        self.on_corrupt = on_corrupt
        self.index = 0

    def error(self, message: str, start: int, then: str = "") -> CorruptRecordError:
        """An error naming the file, the current record and its byte offset (then what was done about it)."""
        return CorruptRecordError(
            f"{where(self.path, record=self.index)}: {message} (record starts at byte offset "
            f"{start}{self.offset_note}){then}")

    def lose(self, start: int, size: int, records: int, message: str, then: str = "") -> None:
        """Raise the error, or with skip_corrupt report what is skipped and step over it."""
        error = self.error(message, start, then)
        if not self.skip_corrupt:
            raise error
        if self.on_corrupt is not None:
            self.on_corrupt(Skipped(error, records, size))
        self.index += records

    def gzip_error(self, reason: str) -> CorruptRecordError:
        """The gzip layer failed: no record after this point can be found, so this stops even with skip_corrupt."""
        stops = "; records after it cannot be found, so --skip-corrupt cannot skip it" if self.skip_corrupt else ""
        return CorruptRecordError(f"{where(self.path, record=self.index)}: corrupt gzip stream ({reason}) after "
                                  f"byte offset {self.source.offset}{self.offset_note}{stops}")

    def truncated(self, needs: str, left: int) -> str:
        cut = "; the gzip stream ends without its end marker" if self.source.truncated else ""
        return f"truncated: needs {needs}, {left} left{cut}"

    def records(self) -> Iterator[tuple[int, bytes]]:
        """(record index, payload) of every good record; the index counts skipped records too."""
        for index, _, _, data in self.walk(read_data=True):
            yield index, data

    def walk(self, read_data: bool) -> Iterator[tuple[int, int, int, bytes]]:
        """(record index, stream offset of its header, offset after its data CRC, payload) of every good record.

        Without read_data (for an uncompressed file, given its size, and never with skip_corrupt) only the
        headers are read and checked: the payloads are stepped over unread, their CRC unchecked, and b""
        stands for each. That finds where the records are for read tasks that frame them where they run.
        """
        source = self.source
        while True:
            start = source.offset
            header = source.read(HEADER_SIZE)
            if len(header) < HEADER_SIZE:
                if header:
                    self.lose(start, len(header), 1, self.truncated(f"{HEADER_SIZE} header bytes", len(header)))
                elif source.truncated:
                    self.lose(start, 0, 0, "truncated: the gzip stream ends without its end marker")
                return
            (length,) = U64.unpack_from(header)
            stored, computed = U32.unpack_from(header, 8)[0], masked_crc(header[:8])
            if stored != computed:
                self.resynchronise(start, header, f"length CRC mismatch: stored 0x{stored:08x}, "
                                                  f"expected 0x{computed:08x}")
                continue
            if length > self.limit:
                raise InputError(
                    f"{where(self.path, record=self.index)}: the record header at byte offset {start}"
                    f"{self.offset_note} claims {length:,} bytes of data, more than the limit of "
                    f"{self.limit:,} (--max-record-bytes); raise --max-record-bytes if the record is genuine")
            if read_data:
                data = source.read(length)
                footer = source.read(4) if len(data) == length else b""
                got = len(data) + len(footer)
            else:
                data, footer, got = b"", b"", source.skip(length + 4)
            if got < length + 4:
                self.lose(start, HEADER_SIZE + got, 1,
                          self.truncated(f"{length + 4} bytes ({length} data + 4 CRC)", got))
                return
            if read_data:
                (stored,) = U32.unpack(footer)
                computed = masked_crc(data)
                if stored != computed:
                    self.lose(start, HEADER_SIZE + length + 4, 1,
                              f"data CRC mismatch: stored 0x{stored:08x}, expected 0x{computed:08x} "
                              f"for {length} bytes of data")
                    continue
            yield self.index, start, source.offset, data
            self.index += 1

    def resynchronise(self, start: int, header: bytes, message: str) -> None:
        """After a header that cannot be trusted: stop, or with skip_corrupt skip to the next good record."""
        if not self.skip_corrupt:
            raise self.error(message, start)
        found, passed = _resynchronise(self.source, header[1:], self.limit)
        end = self.source.offset if found is None else found
        then = (f"; skipped {end - start:,} bytes to the end: no record whose CRCs check out follows" if found is None
                else f"; skipped {end - start:,} bytes to the next record whose CRCs check out, at byte offset {found}")
        self.lose(start, end - start, 1 + passed, message, then)


_Record = tuple[int, int, int, bytes]
"""(record index, stream offset of its header, offset after its data CRC, payload) as _Reader.walk gives them."""

def _walk(path: str, compression: str | None, skip_corrupt: bool, on_corrupt: OnCorrupt | None,
          limit: int | None, read_data: bool = True) -> Iterator[_Record]:
    """Every good record of one file (see _Reader.walk); the index counts skipped records too, so it is the
    position in the file. Without read_data, an uncompressed file read without skip_corrupt is walked by its
    headers alone (anything else is read whole: a GZIP stream has no random access, and what skip_corrupt
    skips must be known where it is counted)."""
    compressed = resolve_compression(path, compression) == "GZIP"
    headers_only = not (read_data or compressed or skip_corrupt)
    with open_record_file(path, random_access=headers_only) as raw:
        source = (RecordStream(raw, False, fs.file_size(path), REMOTE_INDEX_BLOCK if fs.is_uri(path) else INDEX_BLOCK)
                  if headers_only else RecordStream(raw, compressed))
        reader = _Reader(path, source, compressed, DEFAULT_MAX_RECORD_BYTES if limit is None else limit,
                         skip_corrupt, on_corrupt)
        try:
            yield from reader.walk(read_data=not headers_only)
        except GzipCorrupt as exc:
            raise reader.gzip_error(str(exc)) from None


def iter_records(path: str, *, compression: str | None = "auto", skip_corrupt: bool = False,
                 on_corrupt: OnCorrupt | None = None, max_record_bytes: int | None = None) -> Iterator[bytes]:
    """Stream the payloads of one TFRecord file, verifying both CRCs of every record.

    A header claiming more than max_record_bytes (default: DEFAULT_MAX_RECORD_BYTES, the CLI's
    --max-record-bytes default) is an InputError before anything is read. With skip_corrupt, a record
    whose data CRC is wrong, a truncated last record and the bytes after a header whose
    length CRC is wrong (up to the next record whose CRCs both check out) are skipped and
    reported to on_corrupt with their exact size. A corrupt gzip stream always stops.
    """
    for *_, data in _walk(path, compression, skip_corrupt, on_corrupt, max_record_bytes):
        yield data


def _chunked(records: Iterable[_Record], chunk_records: int, chunk_bytes: int | None) -> Iterator[list[_Record]]:
    """Records in chunks of at most chunk_records records and, unless a chunk is a single record, at most
    chunk_bytes bytes of payload; a skipped record ends a chunk, so the records of a chunk are consecutive."""
    if chunk_records < 1:
        raise UsageError(f"chunk_records must be at least 1, got {chunk_records}")
    chunk: list[_Record] = []
    size = 0
    for record in records:
        index, start, end, _ = record
        length = end - start - FRAMING
        if chunk and (index != chunk[0][0] + len(chunk) or len(chunk) == chunk_records
                      or (chunk_bytes is not None and size + length > chunk_bytes)):
            yield chunk
            chunk, size = [], 0
        chunk.append(record)
        size += length
    if chunk:
        yield chunk


def iter_record_chunks(path: str, chunk_records: int, *, chunk_bytes: int | None = None,
                       compression: str | None = "auto", skip_corrupt: bool = False,
                       on_corrupt: OnCorrupt | None = None, max_record_bytes: int | None = None,
                       ) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (index of the chunk's first record, payloads) so decoding can run on worker threads.

    A chunk holds at most chunk_records records and, unless it is a single record, at most
    chunk_bytes bytes of payload, so memory per chunk is bounded whatever the record sizes.
    Records in a chunk are consecutive in the file: a skipped corrupt record ends the chunk
    early, so first_index + i is always record i's true index.
    """
    for chunk in _chunked(_walk(path, compression, skip_corrupt, on_corrupt, max_record_bytes),
                          chunk_records, chunk_bytes):
        yield chunk[0][0], [data for *_, data in chunk]


@dataclass(frozen=True)
class Span:
    """Where the records of one chunk are in an uncompressed file: what a read task needs to read them itself."""

    first_record: int
    records: int
    start: int
    """Byte offset of the first record's header."""
    end: int
    """Byte offset after the last record's data CRC."""


def iter_record_spans(path: str, chunk_records: int, *, chunk_bytes: int | None = None, skip_corrupt: bool = False,
                      on_corrupt: OnCorrupt | None = None, max_record_bytes: int | None = None) -> Iterator[Span]:
    """The chunks iter_record_chunks gives of an uncompressed file, as byte ranges, holding no payload.

    The index pass of read tasks that read their records where they run: it reads each record's
    header (the length and its CRC, the limit, the file's size for a truncated last record) and
    steps over the payload, whose CRC the task checks. A header that stops the pass is reported
    after any bad data CRC in the chunk it cuts short (checked here, then), as a reader going
    through the file in order finds them. With skip_corrupt every record is read and both CRCs
    checked here (each payload dropped once checked), so what is skipped is counted to on_corrupt
    in file order and ends its chunk exactly as in iter_record_chunks.
    """
    reached = done = (0, 0)  # (offset, record) after the last record walked, and after the last span yielded

    def walked() -> Iterator[_Record]:
        nonlocal reached
        for index, start, end, _ in _walk(path, None, skip_corrupt, on_corrupt, max_record_bytes, read_data=False):
            reached = end, index + 1
            yield index, start, end, b""

    try:
        for chunk in _chunked(walked(), chunk_records, chunk_bytes):
            span = Span(chunk[0][0], len(chunk), chunk[0][1], chunk[-1][2])
            done = span.end, span.first_record + span.records
            yield span
    except BatchtoolError:
        if reached[0] > done[0] and not skip_corrupt:
            reader = RangeReader(path, compression=None)
            try:
                reader.records(done[0], reached[0], done[1])
            finally:
                reader.close()
        raise


class RangeReader:
    """The records of byte ranges of one file, for reading batches by an index; both CRCs verified.

    Offsets are in the uncompressed record stream. An uncompressed file is read with one seek and
    one read per range; a GZIP stream cannot be entered in the middle, so a range is reached by
    decompressing forward from the last one (cheap when ranges come in file order), and a backward
    jump decompresses from the start of the file again.
    """

    def __init__(self, path: str, compression: str | None = "auto") -> None:
        self.path = path
        self.compressed = resolve_compression(path, compression) == "GZIP"
        try:
            self._raw: BinaryIO = fs.open_input(path) if self.compressed or fs.is_uri(path) else open(path, "rb", 0)
        except OSError as exc:
            raise InputError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.compressed else None
        self._size = None if self.compressed else fs.file_size(path)

    def records(self, start: int, end: int, first_record: int, what: str = "batch",
                label: str | None = None) -> list[bytes]:
        """Payloads of the records in [start, end); errors name the file, then `label` where given (the
        batch the range holds: `batch 3`), then records counting from first_record, and the range as `what`
        (a file shorter than its index says)."""
        at = self.path if label is None else f"{self.path}, {label}"
        if self._gzip is not None:
            try:
                self._gzip.seek(start)
                data = self._gzip.read(end - start)
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise CorruptRecordError(f"{at}: corrupt gzip stream before byte {end} "
                                         f"of the decompressed stream: {exc}") from exc
        else:
            if end > self._size:
                raise CorruptRecordError(f"{at}: {self._size} bytes, but a {what} ends at byte {end}")
            self._raw.seek(start)
            data = self._raw.read(end - start)
        if len(data) < end - start:
            raise CorruptRecordError(f"{where(at, record=first_record)}: the file ends before byte {end}, "
                                     f"where this {what} ends")
        source = RecordStream(io.BytesIO(data), False)
        source.offset = start
        reader = _Reader(at, source, self.compressed, max(end - start, 0), False, None)
        reader.index = first_record
        return [payload for _, payload in reader.records()]

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        self._raw.close()
