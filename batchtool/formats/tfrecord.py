"""TFRecord framing (length, masked CRC32C, payload) read and written without TensorFlow, and TFRecord as a
batchtool format: shards opened as datasets (schema from the manifest or a scan) and written as outputs."""

from __future__ import annotations

import base64
import gzip
import io
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

import google_crc32c
import numpy as np
import pyarrow as pa

from batchtool import fs
from batchtool.errors import BatchtoolError, CorruptRecordError, InputError, OptionError, UsageError, where
from batchtool.formats.base import BATCH_COLUMN, Batches, EncodedBatch, Format, ReadTask, cut

if TYPE_CHECKING:
    from batchtool.dataset import Chunk, Dataset, ReadReport, Shard
    from batchtool.formats.example import FeatureScan
    from batchtool.output import OutputOptions


DEFAULT_MAX_RECORD_BYTES = 16 << 20
"""Largest record read unless the caller allows more (--max-record-bytes). Decoding a record takes a
few times its size for ordinary data, up to about 60 times for millions of tiny features, so this
keeps even a hostile record near the default --memory (1GB)."""

_GZIP_MAGIC = b"\x1f\x8b"
_HEADER_SIZE = 12
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8
_MAX_GZIP_RATIO = 1032
"""The most bytes deflate makes of one: what a GZIP file's size says of its records at most."""
_BLOCK = 1 << 16
"""Bytes read ahead at a time: the unit of buffering, inflating and resynchronising."""
_INDEX_BLOCK = 1 << 12
"""Bytes the index pass reads at a time from a local file: a few small records' headers, or one large record's
header and no more of its payload than that."""
_REMOTE_INDEX_BLOCK = 1 << 20
"""Bytes the index pass reads at a time from an object store, where every read is a request."""


@dataclass(frozen=True)
class Skipped:
    """What --skip-corrupt dropped at one place of a file: the error, and exactly how much it cost.

    bytes counts the stream's bytes from the start of the bad record to the next record
    read (of the decompressed stream for GZIP files); records counts the records those
    bytes held, as far as their framing shows: at least one, except for a gzip stream cut
    short at a record boundary, which has nothing left to count.
    """

    error: CorruptRecordError
    records: int
    bytes: int


OnCorrupt = Callable[[Skipped], None]

_limit = DEFAULT_MAX_RECORD_BYTES


def max_record_bytes() -> int:
    """The record size limit in force: DEFAULT_MAX_RECORD_BYTES unless a record_limit block says otherwise."""
    return _limit


def check_record_limit(limit: int) -> int:
    """limit itself, or UsageError if it cannot be a record size limit."""
    if limit < 1:
        raise UsageError(f"--max-record-bytes {limit}: must be at least 1 byte")
    return limit


@contextmanager
def record_limit(limit: int) -> Iterator[None]:
    """Make `limit` the record size limit of every reader opened in the block (on any thread).

    A process-wide setting, as a command's options are: the CLI sets it from --max-record-bytes
    around the whole command, so every reader of that command obeys it.
    """
    global _limit
    previous, _limit = _limit, check_record_limit(limit)
    try:
        yield
    finally:
        _limit = previous


def masked_crc(data: bytes) -> int:
    """CRC32C of data, masked as TFRecord stores it (so CRCs of CRCs do not degenerate)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _length_crc_tables() -> tuple[int, np.ndarray]:
    """CRC32C of 8 zero bytes, and each 16-bit value's contribution at each of 4 byte pairs.

    CRC32C is affine over GF(2) for a fixed length, so the CRC of any 8 bytes is the zero
    CRC xor one table entry per byte pair: what lets _valid_headers test every offset at once.
    """
    zero = google_crc32c.value(bytes(8))
    single = np.zeros((8, 256), dtype=np.uint32)
    for position in range(8):
        for value in range(256):
            message = bytearray(8)
            message[position] = value
            single[position, value] = google_crc32c.value(bytes(message)) ^ zero
    pairs = np.arange(1 << 16)
    return zero, np.stack([single[2 * k][pairs & 0xFF] ^ single[2 * k + 1][pairs >> 8] for k in range(4)])


_ZERO_CRC, _CRC_TABLES = _length_crc_tables()
_EMPTY_HEADER_CRC = masked_crc(bytes(8))


def _valid_headers(window: memoryview, limit: int) -> np.ndarray:
    """Every offset i where window[i:i + 12] is a record header of at most `limit` bytes whose length CRC checks out."""
    count = len(window) - _HEADER_SIZE + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)

    def at_every_byte(dtype: str, offset: int, size: int) -> np.ndarray:
        return np.ndarray((size,), dtype=dtype, buffer=window, offset=offset, strides=(1,))

    lengths = at_every_byte("<u8", 0, count)
    stored = at_every_byte("<u4", 8, count)
    empty = np.flatnonzero((lengths == 0) & (stored == _EMPTY_HEADER_CRC))  # zeroed regions: no CRC work
    at = np.flatnonzero((lengths <= limit) & (lengths > 0))
    pairs = at_every_byte("<u2", 0, count + 6)
    crc = np.uint32(_ZERO_CRC) ^ _CRC_TABLES[0][pairs[at]] ^ _CRC_TABLES[1][pairs[at + 2]] \
        ^ _CRC_TABLES[2][pairs[at + 4]] ^ _CRC_TABLES[3][pairs[at + 6]]
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return np.union1d(empty, at[masked == stored[at]])


def _header_is_valid(header: bytes) -> bool:
    """True if 12 bytes form a TFRecord header whose length CRC checks out."""
    return len(header) == _HEADER_SIZE and masked_crc(header[:8]) == _U32.unpack_from(header, 8)[0]


def _open_input(path: str, random_access: bool = False) -> BinaryIO:
    """The file opened for buffered sequential reading, or (random_access) for reads where seeks skip what is
    not read: a local file unbuffered; a missing or unreadable file is an InputError."""
    try:
        if random_access and not fs.is_uri(path):
            return open(path, "rb", buffering=0)  # noqa: SIM115 (the caller closes it)
        return fs.open_input(path, sequential=not random_access)
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


class _GzipCorrupt(Exception):
    """The gzip layer cannot go on (bad deflate data, a bad member CRC): no record boundary can be found after it."""


class _Inflater:
    """The members of a GZIP file inflated in bounded pieces: no read returns more than asked for,
    whatever the compression ratio, and a stream cut short returns every byte it holds."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._zlib = zlib.decompressobj(31)
        self._input = b""
        self._fed = False
        self.truncated = False
        """The file ended inside a gzip member (no end marker): the stream is cut short."""

    def read(self, size: int) -> bytes:
        """Up to size inflated bytes; b"" at the end."""
        while True:
            if not self._input:
                self._input = self._raw.read(_BLOCK)
                if not self._input:
                    return self._end()
            if self._zlib.eof:
                self._input = self._input.lstrip(b"\0")  # zero padding after a member, as gzip allows
                if not self._input:
                    continue
                self._zlib, self._fed = zlib.decompressobj(31), False
            try:
                out = self._zlib.decompress(self._input, size)
            except zlib.error as exc:
                raise _GzipCorrupt(str(exc)) from None
            self._fed = True
            self._input = self._zlib.unused_data if self._zlib.eof else self._zlib.unconsumed_tail
            if out:
                return out

    def _end(self) -> bytes:
        """What is left at the end of the file: a cut-short member's last bytes, if any."""
        if self._zlib.eof or not self._fed or self.truncated:
            return b""
        self.truncated = True
        try:
            return self._zlib.flush()
        except zlib.error as exc:
            raise _GzipCorrupt(str(exc)) from None


class _Source:
    """One file's record stream (inflated if GZIP), read in blocks, with push-back for resynchronising."""

    def __init__(self, raw: BinaryIO, compressed: bool, size: int | None = None, block: int = _BLOCK) -> None:
        self._raw = raw
        self._inflater = _Inflater(raw) if compressed else None
        self._size = size
        """The file's size, for skip() (an uncompressed file read from its start only)."""
        self._block = block
        self._buf = b""
        self._pos = 0
        self.offset = 0
        """Stream offset of the next byte read() returns."""

    @property
    def truncated(self) -> bool:
        """True once a GZIP stream has turned out to end without its end marker."""
        return self._inflater is not None and self._inflater.truncated

    def _more(self, size: int) -> bytes:
        return self._raw.read(size) if self._inflater is None else self._inflater.read(size)

    def read(self, size: int) -> bytes:
        """size bytes, fewer only at the end of the stream; never more than size are held for it."""
        end = self._pos + size
        if end <= len(self._buf):
            out = self._buf[self._pos:end]
            self._pos = end
        else:
            pieces = [self._buf[self._pos:]]
            have = len(pieces[0])
            self._buf, self._pos = b"", 0
            while have < size:
                want = size - have
                block = self._more(max(want, self._block))
                if not block:
                    break
                if len(block) > want:
                    self._buf, self._pos = block, want
                    block = block[:want]
                pieces.append(block)
                have += len(block)
            out = b"".join(pieces)
        self.offset += len(out)
        return out

    def skip(self, size: int) -> int:
        """Step over size bytes without reading them (a seek past what is buffered); the bytes stepped over,
        fewer only at the end of the file. Only for an uncompressed file read from its start, given its size."""
        buffered = len(self._buf) - self._pos
        if size <= buffered:
            self._pos += size
        else:
            size = max(buffered, min(size, self._size - self.offset))
            self._buf, self._pos = b"", 0
            self._raw.seek(self.offset + size)
        self.offset += size
        return size

    def unread(self, data: bytes) -> None:
        """Put bytes back in front of the stream (they were read past a resynchronisation point)."""
        self._buf = data + self._buf[self._pos:]
        self._pos = 0
        self.offset -= len(data)


def _resynchronise(source: _Source, seen: bytes, limit: int) -> tuple[int | None, int]:
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
        if not ended and len(window) - pos < _BLOCK + _HEADER_SIZE:
            more = source.read(_BLOCK)
            ended = len(more) < _BLOCK
            window, base, pos = window[pos:] + more, base + pos, 0
        stop = min(len(window), pos + _BLOCK + _HEADER_SIZE - 1)
        for at in (_valid_headers(memoryview(window)[pos:stop], limit) + pos).tolist():
            (length,) = _U64.unpack_from(window, at)
            end = at + _HEADER_SIZE + length + 4
            if len(window) < end and not ended:
                wanted = max(end - len(window), len(window))  # grow geometrically: few copies
                more = source.read(wanted)
                ended = len(more) < wanted
                window += more
            if len(window) >= end:
                stored = _U32.unpack_from(window, end - 4)[0]
                if masked_crc(window[at + _HEADER_SIZE:end - 4]) == stored:
                    source.unread(window[at:])
                    return base + at, passed
            passed += 1
        pos = max(pos, stop - _HEADER_SIZE + 1)
        if ended and len(window) - pos < _HEADER_SIZE:
            return None, passed


class _Reader:
    """Reads one file's records in order, verifying both CRCs; with skip_corrupt, steps over what is
    damaged and reports exactly what that cost."""

    def __init__(self, path: str, source: _Source, compressed: bool, limit: int, skip_corrupt: bool,
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
            header = source.read(_HEADER_SIZE)
            if len(header) < _HEADER_SIZE:
                if header:
                    self.lose(start, len(header), 1, self.truncated(f"{_HEADER_SIZE} header bytes", len(header)))
                elif source.truncated:
                    self.lose(start, 0, 0, "truncated: the gzip stream ends without its end marker")
                return
            (length,) = _U64.unpack_from(header)
            stored, computed = _U32.unpack_from(header, 8)[0], masked_crc(header[:8])
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
                self.lose(start, _HEADER_SIZE + got, 1,
                          self.truncated(f"{length + 4} bytes ({length} data + 4 CRC)", got))
                return
            if read_data:
                (stored,) = _U32.unpack(footer)
                computed = masked_crc(data)
                if stored != computed:
                    self.lose(start, _HEADER_SIZE + length + 4, 1,
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
_FRAMING = _HEADER_SIZE + 4
"""Bytes a record's framing adds to its payload: the header and the data CRC."""


def _walk(path: str, compression: str | None, skip_corrupt: bool, on_corrupt: OnCorrupt | None,
          limit: int | None, read_data: bool = True) -> Iterator[_Record]:
    """Every good record of one file (see _Reader.walk); the index counts skipped records too, so it is the
    position in the file. Without read_data, an uncompressed file read without skip_corrupt is walked by its
    headers alone (anything else is read whole: a GZIP stream has no random access, and what skip_corrupt
    skips must be known where it is counted)."""
    compressed = _resolve_compression(path, compression) == "GZIP"
    headers_only = not (read_data or compressed or skip_corrupt)
    with _open_input(path, random_access=headers_only) as raw:
        source = (_Source(raw, False, fs.file_size(path), _REMOTE_INDEX_BLOCK if fs.is_uri(path) else _INDEX_BLOCK)
                  if headers_only else _Source(raw, compressed))
        reader = _Reader(path, source, compressed, max_record_bytes() if limit is None else limit,
                         skip_corrupt, on_corrupt)
        try:
            yield from reader.walk(read_data=not headers_only)
        except _GzipCorrupt as exc:
            raise reader.gzip_error(str(exc)) from None


def iter_records(path: str, *, compression: str | None = "auto", skip_corrupt: bool = False,
                 on_corrupt: OnCorrupt | None = None, max_record_bytes: int | None = None) -> Iterator[bytes]:
    """Stream the payloads of one TFRecord file, verifying both CRCs of every record.

    A header claiming more than max_record_bytes (default: the limit in force, see
    record_limit) is an InputError before anything is read. With skip_corrupt, a record
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
        length = end - start - _FRAMING
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
        self.compressed = _resolve_compression(path, compression) == "GZIP"
        try:
            self._raw: BinaryIO = fs.open_input(path) if self.compressed or fs.is_uri(path) else open(path, "rb", 0)
        except OSError as exc:
            raise InputError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.compressed else None
        self._size = None if self.compressed else fs.file_size(path)

    def records(self, start: int, end: int, first_record: int, what: str = "batch") -> list[bytes]:
        """Payloads of the records in [start, end); errors name records counting from first_record, and the
        range as `what` (a file shorter than its index says)."""
        if self._gzip is not None:
            try:
                self._gzip.seek(start)
                data = self._gzip.read(end - start)
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise CorruptRecordError(f"{self.path}: corrupt gzip stream before byte {end} "
                                         f"of the decompressed stream: {exc}") from exc
        else:
            if end > self._size:
                raise CorruptRecordError(f"{self.path}: {self._size} bytes, but a {what} ends at byte {end}")
            self._raw.seek(start)
            data = self._raw.read(end - start)
        if len(data) < end - start:
            raise CorruptRecordError(f"{where(self.path, record=first_record)}: the file ends before byte {end}, "
                                     f"where this {what} ends")
        source = _Source(io.BytesIO(data), False)
        source.offset = start
        reader = _Reader(self.path, source, self.compressed, max(end - start, 0), False, None)
        reader.index = first_record
        return [payload for _, payload in reader.records()]

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


def encode_batch_index(starts: list[tuple[int, int]]) -> str:
    """A TFRecord file's batch index for the manifest: where each batch starts, then the end, as (byte offset
    in the uncompressed record stream, record number) pairs; little-endian uint64, zlib, base64."""
    return base64.b64encode(zlib.compress(np.asarray(starts, dtype="<u8").tobytes())).decode("ascii")


def decode_batch_index(text: str, batches: int) -> np.ndarray:
    """[batches + 1, 2] (offset, record) of encode_batch_index; ValueError if it does not hold that many."""
    size = (batches + 1) * 16
    raw = zlib.decompressobj().decompress(base64.b64decode(text, validate=True), size + 1)
    if len(raw) != size:
        raise ValueError(f"holds {len(raw) // 16 - 1} batches, not {batches}")
    index = np.frombuffer(raw, dtype="<u8").reshape(batches + 1, 2).astype(np.int64)
    if (np.diff(index, axis=0) < 0).any():
        raise ValueError("offsets go backwards")
    return index


class _Sink:
    """The one TFRecord writer: framed records appended to a file (through gzip when asked), counted, and
    where each batch starts. GZIP output has no file name and a zero mtime in its header, so the same
    records always give the same bytes."""

    def __init__(self, file: BinaryIO, codec: str) -> None:
        self._file = file
        self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=file, mtime=0) if codec == "gzip" else None
        self._starts: list[tuple[int, int]] = []
        """(byte offset in the uncompressed record stream, record number) where each batch starts."""
        self.stream_bytes = 0
        """Framed (uncompressed) bytes written so far."""
        self.records = 0

    def append(self, framed: bytes, records: int) -> None:
        """Append `records` framed records."""
        self.stream_bytes += len(framed)
        self.records += records
        (self._gzip or self._file).write(framed)

    def write(self, encoded: EncodedBatch) -> None:
        self._starts.append((self.stream_bytes, self.records))
        self.append(encoded.framed, encoded.data.num_rows)

    def finish(self) -> None:
        """End the gzip stream, if any (safe to call twice); the file stays open."""
        if self._gzip is not None:
            self._gzip.close()

    def close(self) -> dict:
        self.finish()
        return {"batch_index": encode_batch_index([*self._starts, (self.stream_bytes, self.records)])}

    def abandon(self) -> None:
        self.finish()


class TFRecordFileWriter:
    """Records written to one file by path, optionally GZIP-compressed, by the writer output shards use (so
    the same records give the same bytes either way). bytes_written counts framed (uncompressed) bytes;
    stat the file for its size on disk."""

    def __init__(self, path: str, compression: str | None = None) -> None:
        if compression and compression.upper() != "GZIP":
            raise UsageError(f"{path}: unsupported TFRecord compression {compression!r}; expected None or 'GZIP'")
        self.path = path
        self._raw: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._sink = _Sink(self._raw, "gzip" if compression else "none")

    @property
    def records(self) -> int:
        return self._sink.records

    @property
    def bytes_written(self) -> int:
        return self._sink.stream_bytes

    def write(self, payload: bytes) -> None:
        """Append one record."""
        self.write_many((payload,))

    def write_many(self, payloads: Iterable[bytes]) -> None:
        """Append many records with a single write."""
        payloads = list(payloads)
        self._sink.append(frame_records(payloads), len(payloads))

    def close(self) -> None:
        """Flush and close (also ends the gzip stream); safe to call twice."""
        self._sink.finish()
        self._raw.close()

    def __enter__(self) -> TFRecordFileWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


CHUNK_RECORDS = 1024
"""Records per decode task: big enough to amortise overhead, small enough to spread across threads."""
CHUNK_BYTES = 16 << 20
"""Payload bytes per decode task at most (a larger record is a task alone): bounds the memory of a
task whatever the record sizes."""
SCAN_RECORDS = 4096
SCAN_BYTES = 4 << 20
"""Records and payload bytes per step of the schema pass: it walks many records at once (bigger steps
go faster), but keeps a few arrays per feature value of the step."""


@dataclass(frozen=True)
class _Records:
    """Consecutive records of one file, as a task gets them: a byte range of an uncompressed file (a Span from
    the index pass), which the task reads, frames and CRC-checks where it runs, so only a path and offsets
    travel to it; or, from a GZIP stream, which reads only forward, the payloads the reader read and checked."""

    path: str
    first_record: int
    span: Span | None = None
    held: list[bytes] | None = None

    def payloads(self) -> list[bytes]:
        """The payloads, both CRCs checked: a span's read and checked now, where the task runs."""
        if self.span is None:
            return self.held or []
        span = self.span
        reader = RangeReader(self.path, compression=None)
        try:
            payloads = reader.records(span.start, span.end, span.first_record,
                                      what="chunk of records indexed when reading began")
        finally:
            reader.close()
        if len(payloads) != span.records:
            raise CorruptRecordError(f"{where(self.path, record=span.first_record)}: bytes {span.start}..{span.end} "
                                     f"hold {len(payloads)} records, not the {span.records} indexed when reading "
                                     "began: the file changed while it was read")
        return payloads


def _file_records(path: str, chunk_records: int, chunk_bytes: int, skip_corrupt: bool,
                  on_corrupt: OnCorrupt | None, max_record_bytes: int) -> Iterator[_Records]:
    """One file's records in chunks for tasks: byte ranges from a pass over the headers (iter_record_spans) of an
    uncompressed file, payloads read and CRC-checked here from a GZIP one; what is skipped goes to on_corrupt."""
    if detect_compression(path) == "GZIP":
        for first, payloads in iter_record_chunks(path, chunk_records, chunk_bytes=chunk_bytes, compression="GZIP",
                                                  skip_corrupt=skip_corrupt, on_corrupt=on_corrupt,
                                                  max_record_bytes=max_record_bytes):
            yield _Records(path, first, held=payloads)
        return
    for span in iter_record_spans(path, chunk_records, chunk_bytes=chunk_bytes, skip_corrupt=skip_corrupt,
                                  on_corrupt=on_corrupt, max_record_bytes=max_record_bytes):
        yield _Records(path, span.first_record, span=span)


@dataclass(frozen=True)
class _Task:
    """A read task: a chunk's records (see _Records) decoded (protobuf) where the task runs."""

    shard: Shard
    records: _Records
    schema: pa.Schema
    kind: str

    def __call__(self) -> Chunk:
        from batchtool.dataset import shard_chunk
        from batchtool.formats import example as example_codec

        first = self.records.first_record
        batch = example_codec.decode_records(self.records.payloads(), self.schema, self.kind, path=self.shard.path,
                                             first_record=first)
        return shard_chunk(batch, self.schema, self.shard, first, "record")


@dataclass(frozen=True)
class _ScanTask:
    """A step of the schema pass: a chunk's feature names, kinds and counts, found where the task runs."""

    records: _Records
    kind: str

    def __call__(self) -> FeatureScan:
        from batchtool.formats import example as example_codec

        return example_codec.scan_records(self.records.payloads(), self.kind, path=self.records.path,
                                          first_record=self.records.first_record)


@dataclass(frozen=True)
class FileTask:
    """One whole file, framed, CRC-checked and decoded by whoever runs it: a worker of a distributed pass
    (batchtool.exchange), so the records never pass through the driver."""

    shard: Shard
    schema: pa.Schema
    kind: str
    skip_corrupt: bool
    max_record_bytes: int

    @property
    def compressed(self) -> bool:
        """A GZIP stream: its records can only be framed in one pass from its start."""
        return detect_compression(self.shard.path) == "GZIP"

    def tasks(self, report: ReadReport) -> Iterator[_Task]:
        """The file's read tasks for the engine, in order, each reading its own records where it runs (but a GZIP
        file's: see _file_records); what is skipped (skip_corrupt) goes to `report`."""
        for records in _file_records(self.shard.path, CHUNK_RECORDS, CHUNK_BYTES, self.skip_corrupt, report.record,
                                     self.max_record_bytes):
            yield _Task(self.shard, records, self.schema, self.kind)

    def __call__(self, report: ReadReport) -> Iterator[Chunk]:
        """The file's chunks, read in one pass in order where this runs (no index pass: it reads every record)."""
        for first, payloads in iter_record_chunks(
                self.shard.path, CHUNK_RECORDS, chunk_bytes=CHUNK_BYTES, skip_corrupt=self.skip_corrupt,
                on_corrupt=report.record, max_record_bytes=self.max_record_bytes):
            yield _Task(self.shard, _Records(self.shard.path, first, held=payloads), self.schema, self.kind)()


def _scan_schema(src: str, shards: tuple[Shard, ...], kind: str, skip_corrupt: bool,
                 max_record_bytes: int) -> tuple[pa.Schema, str]:
    """The schema of every feature of every record: one pass over names, kinds and counts, not values, in steps
    that run where the engine runs tasks (the records of uncompressed files are read there), merged here in
    file order.

    Corrupt records skipped here are skipped (and counted) again by the pass that reads the data.
    """
    from batchtool.formats import example as example_codec
    from batchtool.runner import ordered_map

    steps = (_ScanTask(records, kind) for shard in shards
             for records in _file_records(shard.path, SCAN_RECORDS, SCAN_BYTES, skip_corrupt, None, max_record_bytes))
    scan = example_codec.FeatureScan()
    for found in ordered_map(lambda step: step(), steps, 1):
        scan = scan.merge(found)
    if not scan.records:
        raise InputError(f"{src}: empty input: no TFRecord records to infer a schema from")
    return scan.schema(kind, src)


def _schema_problem(payloads: list[bytes], path: str, schema: pa.Schema, kind: str) -> str | None:
    """How a file's first records differ from `schema`: they do not decode to it, or hold features it lacks."""
    from batchtool.formats import example as example_codec

    try:
        example_codec.decode_records(payloads, schema, kind, path=path, first_record=0)
    except InputError as exc:
        return str(exc)
    inferred, _ = example_codec.infer_schema(payloads, kind, path=path)
    extra = [n for n in inferred.names if n not in schema.names]
    return f"features not in the manifest's schema: {', '.join(extra)}" if extra else None


def _scan_batch_index(path: str, schema: pa.Schema, kind: str, batches: int) -> np.ndarray:
    """The batch index batchtool 0.1 did not write: one pass over the file's framing, decoding only the `batch`
    column; a batch starts where its value changes. [batches + 1, 2] (stream offset, record) as the manifest's."""
    from batchtool.formats import example as example_codec
    from batchtool.manifest import MANIFEST_NAME

    if BATCH_COLUMN not in schema.names:
        raise InputError(f"{path}: no batch index in {MANIFEST_NAME} and no {BATCH_COLUMN!r} column to find the "
                         "batches by; write the output again")
    schema = pa.schema([schema.field(BATCH_COLUMN)])
    starts: list[tuple[int, int]] = []
    offset = record = 0
    previous = None
    for first, payloads in iter_record_chunks(path, CHUNK_RECORDS):
        ids = example_codec.decode_records(payloads, schema, kind, path=path, first_record=first).column(0)
        for payload, batch in zip(payloads, ids.to_pylist()):
            if batch != previous or not starts:
                starts.append((offset, record))
                previous = batch
            offset += len(payload) + 16  # 8-byte length, its CRC, the payload, its CRC
            record += 1
    starts.append((offset, record))
    if len(starts) - 1 != batches:
        raise InputError(f"{path}: {len(starts) - 1} runs of the {BATCH_COLUMN!r} column, but {MANIFEST_NAME} "
                         f"lists {batches} batches")
    return np.asarray(starts, dtype=np.int64)


@dataclass(frozen=True)
class _Batches(Batches):
    """Byte ranges from the batch index the manifest holds; the I/O happens here, in stream order."""

    paths: tuple[str, ...]
    ranges: tuple[np.ndarray, ...]
    """Per file, (byte offset, record number) where each batch starts, then the end."""
    kind: str
    gzip: bool

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        return np.diff(self.ranges[f][:, 1])[local]

    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict, verify: bool = False) -> _Decode:
        from batchtool.manifest import MANIFEST_NAME

        path = self.paths[f]
        reader = cache.get(f)
        if reader is None:
            reader = cache[f] = RangeReader(path)
        ranges = self.ranges[f]
        payloads: list[bytes] = []
        rows = []
        for i in local:
            (start, first), (end, stop) = ranges[i], ranges[i + 1]
            records = reader.records(int(start), int(end), int(first))
            if len(records) != stop - first:
                raise InputError(f"{path}: bytes {start}..{end} hold {len(records)} records, but "
                                 f"{MANIFEST_NAME} indexes {stop - first} for this batch")
            payloads += records
            rows.append(len(records))
        return _Decode(path, payloads, rows, int(ranges[local[0]][1]), schema, self.kind)

    def unshuffled(self) -> str | None:
        return ("GZIP-compressed TFRecord, which can only be read forward (write Arrow IPC, Parquet or "
                "uncompressed TFRecord for shuffled reads)") if self.gzip else None

    def release(self, cache: dict) -> None:
        for reader in cache.values():
            reader.close()
        cache.clear()


@dataclass(frozen=True)
class _Decode(ReadTask):
    """Several batches' records (read in order by the reader), decoded in one call, cut back into batches."""

    path: str
    payloads: list[bytes]
    rows: list[int]
    first_record: int
    schema: pa.Schema
    kind: str

    def __call__(self) -> list[pa.RecordBatch]:
        from batchtool.formats import example as example_codec

        decoded = example_codec.decode_records(self.payloads, self.schema, self.kind, path=self.path,
                                               first_record=self.first_record)
        return cut(decoded, self.rows)


def _narrowed(batch: pa.RecordBatch, options: OutputOptions) -> pa.RecordBatch:
    """The values written: --cast's narrowing (an extension type's values are its storage's)."""
    stored = options.narrowed_schema(batch.schema)
    return batch if stored == batch.schema else batch.cast(stored)


def _lists(options: OutputOptions) -> tuple[str, ...] | None:
    """An op's feature lists: they matter to SequenceExample records only (tf.train.Example has none)."""
    return options.sequence_columns if options.tfrecord_kind == "sequence_example" else None


class TFRecordFormat(Format):
    """TFRecord shards of tf.train.SequenceExample (or Example) records, directly batchable by tf.data."""

    name = "tfrecord"
    label = "TFRecord"
    suffixes = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrecord.gzip")
    codecs = ("gzip", "none")
    default_codec = "none"
    unit = "record"
    float32_only = True  # tf.train.FloatList
    record_checksums = True
    def most_batches(self, size: int, codec: str | None) -> int:
        """A batch is a record at least (a header and a data CRC) in the record stream, which gzip may have made up to
        _MAX_GZIP_RATIO times smaller."""
        return size * (_MAX_GZIP_RATIO if codec == "gzip" else 1) // (_HEADER_SIZE + 4)
    """A batch holds a record, 16 bytes of framing at least, which gzip shrinks 1032-fold at most."""
    self_indexing = False

    def suffix(self, codec: str) -> str:
        return ".tfrecord.gz" if codec == "gzip" else ".tfrecord"

    def check_options(self, options: OutputOptions) -> None:
        if options.codec not in self.codecs:
            raise OptionError("compression", f"{{compression}} {options.compression!r}: TFRecord takes gzip or none")

    def record_kind(self, options: OutputOptions) -> str:
        return options.tfrecord_kind

    def encode(self, batch: pa.RecordBatch, options: OutputOptions) -> EncodedBatch:
        from batchtool.formats import example as example_codec

        batch = _narrowed(batch, options)
        payloads = example_codec.encode_records(batch, options.tfrecord_kind, sequence_columns=_lists(options))
        return EncodedBatch(batch, b"".join(frame_record(p) for p in payloads))

    def check_values(self, batch: pa.RecordBatch, options: OutputOptions) -> None:
        from batchtool.formats import example as example_codec

        example_codec.check_values(_narrowed(batch, options), options.tfrecord_kind,
                                   sequence_columns=_lists(options))

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: OutputOptions) -> _Sink:
        return _Sink(file, options.codec)

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: dict) -> Dataset:
        """Without a schema, the manifest's (a batchtool output), else a scan of every record."""
        from batchtool.dataset import Dataset
        from batchtool.manifest import schema_from_json

        limit = check_record_limit(max_record_bytes() if reading.get("max_record_bytes") is None
                                   else reading["max_record_bytes"])
        kind, skip_corrupt = reading.get("tfrecord_kind", "auto"), reading.get("skip_corrupt", False)
        if schema is None and manifest and manifest.get("schema"):
            schema = schema_from_json(manifest["schema"])
            kind = manifest.get("output", {}).get("tfrecord_kind", kind)
        if schema is None:
            schema, kind = _scan_schema(src, shards, kind, skip_corrupt, limit)
        elif kind == "auto":
            kind = "sequence_example"
        return Dataset(src, self.name, shards, schema, tfrecord_kind=kind, skip_corrupt=skip_corrupt,
                       manifest=manifest, max_record_bytes=limit)

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        """Every record read and CRC-checked."""
        return sum(1 for _ in iter_records(shard.path, skip_corrupt=dataset.skip_corrupt, on_corrupt=report.record,
                                           max_record_bytes=dataset.max_record_bytes))

    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, _Batches]:
        """From the batch index in the manifest (outputs of batchtool 0.1 have none: a scan of the `batch`
        column finds it); without a manifest, an InputError."""
        from batchtool.manifest import MANIFEST_NAME

        if not dataset.manifest:
            raise InputError(f"{dst}: TFRecord batches need the {MANIFEST_NAME} batchtool wrote beside them")
        output = dataset.manifest["output"]
        kind = dataset.tfrecord_kind or "sequence_example"
        ranges = []
        for shard, entry in zip(dataset.shards, output["files"]):
            if "batch_index" not in entry:  # written by batchtool 0.1: index it from its `batch` column, once
                ranges.append(_scan_batch_index(shard.path, dataset.schema, kind, int(entry["batches"])))
                continue
            batches = int(entry["batches"])  # (no more than the file holds: load checked it, most_batches)
            try:
                ranges.append(decode_batch_index(entry["batch_index"], batches))
            except (ValueError, TypeError, zlib.error) as exc:
                raise InputError(f"{shard.path}: unreadable batch index in {MANIFEST_NAME} ({exc})") from exc
        counts = np.array([e["batches"] for e in output["files"]], dtype=np.int64)
        return counts, _Batches(tuple(s.path for s in dataset.shards), tuple(ranges), kind,
                                output.get("compression") == "gzip")

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int | None, str | None]:
        """Records counted, batches as runs of the batch column (decoding it); the first chunk must decode to
        `schema` and hold no feature it lacks (a TFRecord file records no schema of its own)."""
        from batchtool.formats import example as example_codec

        kind = output.get("tfrecord_kind") or "sequence_example"
        batch_schema = (pa.schema([schema.field(batch_column)])
                        if batch_column is not None and batch_column in schema.names else None)
        rows = batches = 0
        previous = None
        problem = None
        for first, payloads in iter_record_chunks(path, CHUNK_RECORDS):
            if first == 0:
                problem = _schema_problem(payloads, path, schema, kind)
            rows += len(payloads)
            if batch_schema is not None:
                ids = example_codec.decode_records(payloads, batch_schema, kind, path=path,
                                                   first_record=first).column(0).to_numpy(zero_copy_only=False)
                starts = np.r_[previous is None or ids[0] != previous, ids[1:] != ids[:-1]] if len(ids) else []
                batches += int(np.count_nonzero(starts))
                previous = ids[-1] if len(ids) else previous
        return rows, batches if batch_schema is not None else None, problem

    def tasks(self, dataset: Dataset, columns: list[str] | None, report: ReadReport) -> Iterator[_Task]:
        """Tasks that read, frame, CRC-check and decode their records where they run, from byte ranges a pass over
        the record headers finds here; a GZIP file's records are read and CRC-checked here (see _file_records)."""
        for file in self.file_tasks(dataset, columns):
            yield from file.tasks(report)

    def file_tasks(self, dataset: Dataset, columns: list[str] | None) -> Iterator[FileTask]:
        """One task per file, which frames its records where it runs (see batchtool.exchange.read_units)."""
        schema = dataset.projected_schema(columns)
        for shard in dataset.shards:
            yield FileTask(shard, schema, dataset.tfrecord_kind or "auto", dataset.skip_corrupt,
                           dataset.max_record_bytes)
