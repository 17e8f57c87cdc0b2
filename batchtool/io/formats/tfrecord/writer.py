"""Writing TFRecord files: the sink output shards go through (recording where each batch starts: the batch index
the manifest keeps, read back by `batchtool.load`), and a writer of records to a file by path."""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Iterable
from types import TracebackType
from typing import BinaryIO

import numpy as np

from batchtool.core.errors import UsageError
from batchtool.io.formats.base import EncodedBatch
from batchtool.io.formats.tfrecord.framing import frame_records


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


class Sink:
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
        self._sink = Sink(self._raw, "gzip" if compression else "none")

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
