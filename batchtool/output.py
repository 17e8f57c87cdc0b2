"""Batch-shard output: an all-or-nothing output directory, shard rollover, checksums.

One writer serves every format; the formats only encode. Encoding (Arrow -> bytes for
TFRecord) is a pure function run on worker threads; the writer thread only appends.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa

from batchtool import fs
from batchtool.errors import DestinationExistsError, SchemaError, UsageError, where
from batchtool.formats import example as example_codec
from batchtool.formats import parquet as parquet_format
from batchtool.formats import tfrecord as tfrecord_format

PARQUET_CODECS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")
CASTS = {"float64=float32": (pa.float64(), pa.float32())}
"""Lossy conversions TFRecord output makes only when asked (--cast): tf.train.FloatList holds float32."""
TFRECORD_KINDS = ("sequence_example", "example")
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
MAX_SHARD_BATCHES = 4096
"""Row groups per Parquet shard at most: each costs ~1 KB of footer that writer and reader hold in
memory, so shards of many small batches (segment's 32-row batches) roll over by count, not size."""


@dataclass(frozen=True)
class OutputOptions:
    """Where and how batch shards are written."""

    format: str = "parquet"
    compression: str | None = None
    """Parquet codec (default zstd) or, for TFRecord, 'gzip' or none (default)."""
    shard_rows: int | None = None
    shard_bytes: int | None = DEFAULT_SHARD_BYTES
    tfrecord_kind: str = "sequence_example"
    sequence_columns: tuple[str, ...] | None = None
    overwrite: bool = False
    cast: tuple[str, ...] = ()
    """Lossy conversions asked for (keys of CASTS); TFRecord output refuses a column that needs one otherwise."""

    def __post_init__(self) -> None:
        if self.format not in ("parquet", "tfrecord"):
            raise UsageError(f"--to {self.format!r}: expected parquet or tfrecord")
        if self.format == "parquet" and self.codec not in PARQUET_CODECS:
            raise UsageError(f"--compression {self.compression!r}: Parquet takes {', '.join(PARQUET_CODECS)}")
        if self.format == "tfrecord" and self.codec not in ("gzip", "none"):
            raise UsageError(f"--compression {self.compression!r}: TFRecord takes gzip or none")
        if self.tfrecord_kind not in TFRECORD_KINDS:
            raise UsageError(f"--tfrecord-kind {self.tfrecord_kind!r}: expected {' or '.join(TFRECORD_KINDS)}")
        for name, value in (("--shard-rows", self.shard_rows), ("--shard-bytes", self.shard_bytes)):
            if value is not None and value <= 0:
                raise UsageError(f"{name} {value}: must be positive")
        for cast in self.cast:
            if cast not in CASTS:
                raise UsageError(f"--cast {cast!r}: expected {' or '.join(CASTS)}")
            if self.format != "tfrecord":
                raise UsageError(f"--cast {cast}: only TFRecord output narrows values; "
                                 f"{self.format} keeps them exactly")

    def stored_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema the output files hold exactly: for TFRecord, float64 narrowed to float32 if --cast
        asks for it, else SchemaError naming the column (tf.train.FloatList holds only float32)."""
        if self.format != "tfrecord":
            return schema
        fields = []
        for field in schema:
            stored = _narrowed(field.type, [CASTS[c] for c in self.cast])
            if _narrowed(stored, [CASTS["float64=float32"]]) != stored:
                raise SchemaError(f"{where(column=field.name)}: {field.type} cannot be written to TFRecord exactly "
                                  "(tf.train.FloatList holds float32); pass --cast float64=float32 to round it, "
                                  "or write Parquet")
            fields.append(field.with_type(stored))
        return pa.schema(fields, metadata=schema.metadata)

    def casts(self, schema: pa.Schema) -> dict[str, str]:
        """The columns --cast changes, as {name: "old -> new"}, for the manifest."""
        stored = self.stored_schema(schema)
        return {f.name: f"{f.type} -> {s.type}" for f, s in zip(schema, stored) if f.type != s.type}

    @property
    def codec(self) -> str:
        default = "zstd" if self.format == "parquet" else "none"
        return (self.compression or default).lower()

    @property
    def suffix(self) -> str:
        if self.format == "parquet":
            return ".parquet"
        return ".tfrecord.gz" if self.codec == "gzip" else ".tfrecord"


def _narrowed(t: pa.DataType, casts: list[tuple[pa.DataType, pa.DataType]]) -> pa.DataType:
    """t with each (from, to) leaf type replaced, inside any lists."""
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_narrowed(t.value_type, casts)), t.list_size)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        make = pa.large_list if pa.types.is_large_list(t) else pa.list_
        return make(t.value_field.with_type(_narrowed(t.value_type, casts)))
    return next((to for old, to in casts if t == old), t)


@dataclass(frozen=True)
class EncodedBatch:
    """A batch ready for the writer: the Arrow data, plus framed TFRecord bytes when writing TFRecord."""

    data: pa.RecordBatch
    framed: bytes | None = None


def encode_batch(batch: pa.RecordBatch, options: OutputOptions) -> EncodedBatch:
    """Pure and thread-safe: run it on workers so the writer thread only appends bytes."""
    if options.format == "parquet":
        return EncodedBatch(batch)
    stored = options.stored_schema(batch.schema)
    if stored != batch.schema:
        batch = batch.cast(stored)
    payloads = example_codec.encode_records(batch, options.tfrecord_kind,
                                            sequence_columns=options.sequence_columns)
    return EncodedBatch(batch, b"".join(tfrecord_format.frame_record(p) for p in payloads))


class _HashingFile:
    """Write-through file that hashes and counts what it writes (Parquet is written sequentially)."""

    def __init__(self, path: str) -> None:
        self._file: BinaryIO = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.bytes += view.nbytes
        return self._file.write(view)

    def flush(self) -> None:
        self._file.flush()

    def tell(self) -> int:
        return self.bytes

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self.closed = True

    @property
    def writable(self) -> bool:
        return True


class BatchShardWriter:
    """Writes batches to part-NNNNN files, starting a new shard when the size limit is reached.

    Each write() is one batch: one Parquet row group, or its rows as consecutive TFRecord records.
    """

    def __init__(self, directory: str, schema: pa.Schema, options: OutputOptions) -> None:
        self.directory = directory
        self.schema = schema
        self.options = options
        self.files: list[dict] = []
        self._sink: _HashingFile | None = None
        self._encoder: parquet_format.ParquetShardWriter | None = None
        self._gzip = None
        self._rows = 0
        self._batches = 0

    def write(self, encoded: EncodedBatch) -> None:
        if self._sink is None:
            self._open()
        if self.options.format == "parquet":
            self._encoder.write(encoded.data)
        else:
            (self._gzip or self._sink).write(encoded.framed)
        self._rows += encoded.data.num_rows
        self._batches += 1
        if self._full():
            self._close_shard()

    def _full(self) -> bool:
        o = self.options
        return ((o.shard_rows is not None and self._rows >= o.shard_rows)
                or (o.shard_bytes is not None and self._sink.bytes >= o.shard_bytes)
                or (o.format == "parquet" and self._batches >= MAX_SHARD_BATCHES))

    def _open(self) -> None:
        name = f"part-{len(self.files):05d}{self.options.suffix}"
        self._sink = _HashingFile(os.path.join(self.directory, name))
        self._rows = self._batches = 0
        if self.options.format == "parquet":
            codec = None if self.options.codec == "none" else self.options.codec
            self._encoder = parquet_format.ParquetShardWriter(self._sink, self.schema, compression=codec or "none")
        elif self.options.codec == "gzip":
            # mtime=0 and no file name in the header keep gzip output byte-identical across runs
            self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._sink, mtime=0)
        self.files.append({"path": name})

    def _close_shard(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        if self._gzip is not None:
            self._gzip.close()
            self._gzip = None
        self._sink.close()
        self.files[-1].update(rows=self._rows, batches=self._batches, bytes=self._sink.bytes,
                              sha256=self._sink.sha256.hexdigest())
        self._sink = None

    def close(self) -> list[dict]:
        """Finish the last shard; with no batches at all, write one empty shard so the schema survives."""
        if self._sink is None and not self.files:
            self._open()
        if self._sink is not None:
            self._close_shard()
        return self.files


@contextmanager
def output_directory(dst: str, overwrite: bool) -> Iterator[str]:
    """Yield a temporary directory beside DST; rename it to DST only if the block succeeds.

    A failure, Ctrl-C or SIGTERM removes the temporary directory and leaves DST as it was.
    A SIGKILL can leave a `.DST.tmp-*` directory behind, but never touches DST. For an
    object-store DST the directory is local and uploaded at the end (see fs.upload_directory).
    """
    if fs.is_uri(dst):
        check_destination(dst, overwrite)
        tmp = tempfile.mkdtemp(prefix="batchtool-out-")
        try:
            with _sigterm_as_interrupt():
                yield tmp
                fs.upload_directory(tmp, dst, overwrite)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    dst = os.path.abspath(dst)
    check_destination(dst, overwrite)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.tmp-", dir=parent)
    try:
        with _sigterm_as_interrupt():
            yield tmp
            check_destination(dst, overwrite)
            if os.path.lexists(dst):
                old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.old-", dir=parent)
                os.rename(dst, os.path.join(old, "dst"))
                os.rename(tmp, dst)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_destination(dst: str, overwrite: bool) -> None:
    if fs.exists(dst) and not overwrite:
        raise DestinationExistsError(f"{dst}: destination exists (pass --overwrite to replace it)")
    if fs.exists(dst) and not fs.is_dir(dst):
        raise DestinationExistsError(f"{dst}: destination exists and is not a directory; refusing to replace it")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Make `kill` clean up like Ctrl-C does (only possible from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
