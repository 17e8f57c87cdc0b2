"""A TFRecord file's byte stream: opened, its compression told (GZIP or none), inflated in bounded pieces whatever
the ratio, and read in blocks with push-back, so that a reader can resynchronise after damage."""

from __future__ import annotations

import zlib
from typing import BinaryIO

from batchtool.core import fs
from batchtool.core.errors import InputError, UsageError
from batchtool.io.formats.tfrecord.framing import HEADER_SIZE, header_is_valid

_GZIP_MAGIC = b"\x1f\x8b"
MAX_GZIP_RATIO = 1032
"""The most bytes deflate makes of one: what a GZIP file's size says of its records at most."""
BLOCK = 1 << 16
"""Bytes read ahead at a time: the unit of buffering, inflating and resynchronising."""
INDEX_BLOCK = 1 << 12
"""Bytes the index pass reads at a time from a local file: a few small records' headers, or one large record's
header and no more of its payload than that."""
REMOTE_INDEX_BLOCK = 1 << 20
"""Bytes the index pass reads at a time from an object store, where every read is a request."""


def open_record_file(path: str, random_access: bool = False) -> BinaryIO:
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
    with open_record_file(path) as f:
        head = f.read(HEADER_SIZE)
    if head[:2] != _GZIP_MAGIC or header_is_valid(head):
        return None
    return "GZIP"


def resolve_compression(path: str, compression: str | None) -> str | None:
    """Turn 'auto' / None / 'gzip' into None or 'GZIP'; anything else is a usage error."""
    if compression == "auto":
        return detect_compression(path)
    if not compression:
        return None
    if compression.upper() == "GZIP":
        return "GZIP"
    raise UsageError(f"{path}: unsupported TFRecord compression {compression!r}; expected 'auto', None or 'GZIP'")


class GzipCorrupt(Exception):
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
                self._input = self._raw.read(BLOCK)
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
                raise GzipCorrupt(str(exc)) from None
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
            raise GzipCorrupt(str(exc)) from None


class RecordStream:
    """One file's record stream (inflated if GZIP), read in blocks, with push-back for resynchronising."""

    def __init__(self, raw: BinaryIO, compressed: bool, size: int | None = None, block: int = BLOCK) -> None:
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
