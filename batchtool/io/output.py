"""Batch-shard output: an all-or-nothing output directory, shard rollover, checksums.

One writer serves every format; the formats (batchtool.io.formats) only encode and append. Encoding
(Arrow -> a format's bytes, Writer.encode) is a pure function run on worker threads; the writer thread only appends.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

import pyarrow as pa

from batchtool.core import fs
from batchtool.core.errors import (DestinationError, DestinationExistsError, OptionError, OptionSchemaError,
                              where)
from batchtool.io.formats import column_meta, column_types
from batchtool.io.formats.base import EncodedBatch, Format, ShardSink
from batchtool.io.formats import registry
from batchtool.io.formats.registry import DEFAULT
from batchtool.io.formats.declared import CASTS, DEFAULT_SHARD_BYTES

WRITE_BUFFER_BYTES = 1 << 20
"""What a shard's native write buffer gathers before one Python-level write (see BatchShardWriter._open)."""
OVERLAP_BUFFERS = 4
"""Such buffers waiting for a shard's hashing thread (HashingFile's `overlap`): a few MiB."""


@dataclass(frozen=True)
class OutputOptions:
    """Where and how batch shards are written."""

    format: str = DEFAULT
    compression: str | None = None
    """The format's codec (its `codecs`); None for its default (its `default_codec`)."""
    shard_rows: int | None = None
    shard_bytes: int | None = DEFAULT_SHARD_BYTES
    writing: Any = None
    """The format's write options: its Writer.write_options dataclass, or {name: value} made into it (None: its
    defaults)."""
    sequence_columns: tuple[str, ...] | None = None
    stacked_rows: int | None = None
    """Set by the writer, not asked for: every batch has this many rows, and a format that stores stacks
    (Format.stores_stacks) is given runs of consecutive batches as one record batch, each run counted as
    rows / stacked_rows batches (segment's lane steps: a batch's fixed costs are paid once per run, on writing and
    on every epoch of `batchtool.load`)."""
    overwrite: bool = False
    cast: tuple[str, ...] = ()
    """Lossy conversions asked for (keys of CASTS); a format holding floats as float32 only refuses a column that
    needs one otherwise."""
    key: str | None = None
    """Batch output: the column whose values key the examples in its example index (batchtool.io.example_index);
    None: `key` where the output has one."""

    def __post_init__(self) -> None:
        if self.format not in registry.written():
            raise OptionError("format", f"expected {registry.listed(registry.written())}", value=repr(self.format),
                              flags={"format": "--to"})
        if self.writing is None or isinstance(self.writing, Mapping):
            object.__setattr__(self, "writing", self.spec.writing_of(self.writing or {}))  # (frozen: made once, here)
        self.spec.check_options(self)
        for name, value in (("shard_rows", self.shard_rows), ("shard_bytes", self.shard_bytes)):
            if value is not None and value <= 0:
                raise OptionError(name, "must be positive", value=str(value))
        for cast in self.cast:
            if cast not in CASTS:
                raise OptionError("cast", f"expected {' or '.join(CASTS)}", value=repr(cast))
            if not self.spec.float32_only:
                raise OptionError("cast", f"only {registry.narrowing()} output narrows values; "
                                          f"{self.format} keeps them exactly", value=cast)

    def stored_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema the output files hold exactly: narrowed_schema, with the extension types the input's
        columns had put back (formats.column_types) and the metadata describing them rebuilt for the columns written
        (formats.column_meta)."""
        return column_types.written_schema(column_meta.described(self.narrowed_schema(schema)))

    def narrowed_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema of the values written: for a format holding floats as float32 only, float64 narrowed to
        float32 if --cast asks for it, else SchemaError naming the column."""
        if not self.spec.float32_only:
            return schema
        fields = []
        for field in schema:
            stored = _narrowed(field.type, [_cast(c) for c in self.cast])
            if _narrowed(stored, [_cast("float64=float32")]) != stored:
                raise OptionSchemaError("cast", f"{field.type} cannot be written to {self.spec.label} exactly "
                                        f"({self.spec.float32_only}); pass {{cast}} float64=float32 to round it, "
                                        "or write Parquet", where=f"{where(column=field.name)}: ")
            fields.append(field.with_type(stored))
        return pa.schema(fields, metadata=schema.metadata)

    def shard_full(self, rows: int, size: int, batches: int) -> bool:
        """The rollover rule: a shard ends after the batch that reaches --shard-rows, --shard-bytes or the
        format's batches per shard (ShardCutter applies it to a shard's batches as they come)."""
        return ((self.shard_rows is not None and rows >= self.shard_rows)
                or (self.shard_bytes is not None and size >= self.shard_bytes)
                or (self.spec.max_shard_batches is not None and batches >= self.spec.max_shard_batches))

    def batches_in(self, rows: int) -> int:
        """The batches one unit of `rows` rows the writer is given holds (several where it is a stack)."""
        return rows // self.stacked_rows if self.stacked_rows else 1

    def casts(self, schema: pa.Schema) -> dict[str, str]:
        """The columns --cast changes, as {name: "old -> new"}, for the manifest."""
        stored = self.narrowed_schema(schema)
        return {f.name: f"{f.type} -> {s.type}" for f, s in zip(schema, stored) if f.type != s.type}

    @property
    def spec(self) -> Format:
        """The output format (batchtool.io.formats)."""
        return registry.get(self.format)

    @property
    def codec(self) -> str:
        return (self.compression or self.spec.default_codec).lower()

    def recorded(self) -> dict[str, Any]:
        """How the output is written, as the head of a manifest's output section records it (manifest.new_manifest)."""
        return {"format": self.format, "compression": self.codec, **self.spec.recorded_output(self)}

    @property
    def suffix(self) -> str:
        return self.spec.suffix(self.codec)


def _cast(name: str) -> tuple[pa.DataType, pa.DataType]:
    """A cast of CASTS as the Arrow types it converts from and to."""
    source, target = CASTS[name]
    return pa.type_for_alias(source), pa.type_for_alias(target)


def _narrowed(t: pa.DataType, casts: list[tuple[pa.DataType, pa.DataType]]) -> pa.DataType:
    """t with each (from, to) leaf type replaced, inside any lists."""
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_narrowed(t.value_type, casts)), t.list_size)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        make = pa.large_list if pa.types.is_large_list(t) else pa.list_
        return make(t.value_field.with_type(_narrowed(t.value_type, casts)))
    return next((to for old, to in casts if t == old), t)


ENCODE_GROUP_BYTES = 4 << 20
"""Consecutive batches encoded in one call (Format.encode_many) up to about this many bytes of Arrow data."""


def encode_batches(batches: Iterable[pa.RecordBatch], options: OutputOptions) -> Iterator[EncodedBatch]:
    """Pure and thread-safe: run it on workers so the writer thread only appends bytes. Batches are encoded in
    groups of about ENCODE_GROUP_BYTES, each batch's bytes those of encoding it alone."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        group.append(batch)
        size += batch.nbytes
        if size >= ENCODE_GROUP_BYTES:
            yield from options.spec.encode_many(group, options)
            group, size = [], 0
    if group:
        yield from options.spec.encode_many(group, options)


class ShardCutter:
    """Where shards end: fed each batch's rows and size in output order, it says after which batch a shard is
    full (OutputOptions.shard_full). A batch's size is the bytes it adds to its shard before any stream
    compression (a compressed stream of records counts its framed records): a function of the batch alone, the first
    batch of a shard also carrying the file's header. So whoever writes (the writer here as batches arrive,
    or workers writing shards planned from measured sizes: shard_ends) cuts in the same places."""

    def __init__(self, options: OutputOptions) -> None:
        self.options = options
        self.rows = self.bytes = self.batches = 0

    def add(self, rows: int, size: int) -> bool:
        """Count one more unit of the shard (a batch, or a stack of them); True if the shard ends after it (the count
        starts over)."""
        self.rows += rows
        self.bytes += size
        self.batches += self.options.batches_in(rows)
        if not self.options.shard_full(self.rows, self.bytes, self.batches):
            return False
        self.rows = self.bytes = self.batches = 0
        return True


def shard_ends(options: OutputOptions, header: int, rows: Iterable[int], sizes: Iterable[int]) -> list[int]:
    """The batch after which each shard ends (the last always ends at the last batch), from every batch's rows
    and size and the file's header bytes: where BatchShardWriter, fed the same batches, rolls over."""
    cutter, ends, count = ShardCutter(options), [], 0
    for count, (batch_rows, size) in enumerate(zip(rows, sizes), 1):
        if cutter.add(batch_rows, size + (header if cutter.batches == 0 else 0)):
            ends.append(count)
    if not ends or ends[-1] != count:
        ends.append(count)
    return ends


class HashingFile:
    """Write-through file that hashes and counts what it writes (every format writes sequentially). With
    `overlap`, the hashing and the writing run on a thread of their own, fed a copy of each buffer (its caller
    reuses it) through a short queue: the one writer thread then only encodes and copies, and a shard's sha256
    and disk writes overlap the encoding of the batches after them instead of adding to it."""

    def __init__(self, path: str, overlap: bool = False) -> None:
        self._file: BinaryIO = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.closed = False
        self._failed: BaseException | None = None
        self._queue: queue.Queue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if overlap:
            self._queue = queue.Queue(maxsize=OVERLAP_BUFFERS)
            self._thread = threading.Thread(target=self._drain, name="batchtool-hash", daemon=True)
            self._thread.start()

    def _append(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        self._file.write(data)

    def _drain(self) -> None:
        """The overlapping thread: appends every buffer until told to stop; the first failure is kept for the
        writer thread to raise (later buffers are dropped: the shard is lost anyway)."""
        while (data := self._queue.get()) is not None:
            if self._failed is None:
                try:
                    self._append(data)
                except BaseException as exc:  # raised in the writer thread, at its next write or close
                    self._failed = exc
            self._queue.task_done()
        self._queue.task_done()

    def _raise_failure(self) -> None:
        if self._failed is not None:
            raise self._failed

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self.bytes += view.nbytes
        if self._queue is None:
            self._append(view)
        else:
            self._raise_failure()
            self._queue.put(data if type(data) is bytes else bytes(view))  # (pyarrow's PythonFile hands out bytes
            # of their own, which nothing changes after: copied only when given a buffer its caller may reuse)
        return view.nbytes

    def _stop(self) -> None:
        """Every queued buffer appended, and the overlapping thread ended."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def flush(self) -> None:
        if self._queue is not None:
            self._queue.join()
            self._raise_failure()
        self._file.flush()

    def tell(self) -> int:
        return self.bytes

    def close(self) -> None:
        if not self.closed:
            self._stop()
            self._file.close()
            self.closed = True
            self._raise_failure()

    def abandon(self) -> None:
        """Close the file, ignoring a failure to flush, and take any later write (an encoder's footer)
        as done: nothing may write again from a finalizer, at some random later moment."""
        self._stop()
        with suppress(OSError):
            self._file.close()
        self.closed = True
        self.write = lambda data: memoryview(data).nbytes  # type: ignore[method-assign]

    @property
    def writable(self) -> bool:
        return True


class BatchShardWriter:
    """Writes batches to part-NNNNN files, starting a new shard when the size limit is reached.

    Each write() is one batch: one Parquet row group, one Arrow record batch, or its rows as consecutive
    records of a stream.
    """

    def __init__(self, directory: str, schema: pa.Schema, options: OutputOptions, name: str | None = None,
                 first: int = 0, rollover: bool = True, overlap: bool = False) -> None:
        """`first`: the number of the first shard it writes (part-<first>); without `rollover`, everything it is
        given goes into that one shard (a worker writing a shard whose batches shard_ends planned); with
        `overlap`, each shard is hashed and written by a thread of its own (the local engine's one writer, when
        it has threads to spare: HashingFile)."""
        self.directory = directory
        self.name = name or directory
        """What errors name: DST, when `directory` is its temporary twin."""
        self.schema = schema
        self._extensions = any(column_types.holds_extension(f.type) for f in schema)
        """Batches come in the storage of these (formats.column_types): the writer wraps them."""
        self.options = options
        self.files: list[dict] = []
        self._first = first
        self._overlap = overlap
        self._cutter = ShardCutter(options) if rollover else None
        self._sink: HashingFile | None = None
        self._stream: pa.BufferedOutputStream | None = None
        self._encoder: ShardSink | None = None
        self._rows = 0
        self._batches = 0

    def write(self, encoded: EncodedBatch) -> None:
        if self._extensions:
            encoded = replace(encoded, data=column_types.conform_written(encoded.data, self.schema))
        with self._errors():
            if self._sink is None:
                self._open()
            before = self._stream.tell() if self._batches else 0  # a shard's first batch carries its header
            self._encoder.write(encoded)
            self._rows += encoded.data.num_rows
            self._batches += self.options.batches_in(encoded.data.num_rows)
            size = len(encoded.framed) if encoded.framed is not None else self._stream.tell() - before
            if self._cutter is not None and self._cutter.add(encoded.data.num_rows, size):
                self._close_shard()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A failed write is one DestinationError, and leaves no open shard whose finalizer writes again."""
        shard = self.files[-1]["path"] if self._sink is not None else self._shard_name()
        try:
            with fs.write_errors(f"{self.name}: cannot write the output ({shard})"):
                yield
        except BaseException:
            self.abandon()
            raise

    def __enter__(self) -> BatchShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """A block that fails abandons the open shard (its hashing thread ends; the directory goes anyway)."""
        if exc_type is not None:
            self.abandon()

    def abandon(self) -> None:
        """Give up the open shard: nothing more is written to it, and an overlapping thread ends."""
        if self._sink is not None:
            self._sink.abandon()
        if self._encoder is not None:
            self._encoder.abandon()  # into the abandoned sink: cannot fail
        if self._stream is not None:
            with suppress(OSError):
                self._stream.close()
        self._encoder = self._sink = self._stream = None

    def _shard_name(self) -> str:
        return f"part-{self._first + len(self.files):05d}{self.options.suffix}"

    def _open(self) -> None:
        name = self._shard_name()
        self._sink = HashingFile(os.path.join(self.directory, name), self._overlap)
        self._rows = self._batches = 0
        self.files.append({"path": name})
        # Encoders write many small buffers (Arrow IPC about two dozen a batch, Parquet more): gathered in a
        # native buffer (whose tell() counts them for rollover), the writer thread takes the GIL once a
        # megabyte to hash and write them, not once a buffer, and otherwise stays in C++ (which releases
        # it) while the workers run Python.
        self._stream = pa.BufferedOutputStream(pa.PythonFile(self._sink, mode="w"), WRITE_BUFFER_BYTES)
        self._encoder = self.options.spec.open_sink(self._stream, self.schema, self.options)

    def _close_shard(self) -> None:
        extra = self._encoder.close()
        self._encoder = None
        if not self._stream.closed:
            self._stream.close()  # flushes, and closes the sink
        self._stream = None
        self._sink.close()
        self.files[-1].update(rows=self._rows, batches=self._batches, bytes=self._sink.bytes,
                              sha256=self._sink.sha256.hexdigest(), **extra)
        self._sink = None

    def close(self) -> list[dict]:
        """Finish the last shard; with no batches at all, write one empty shard so the schema survives."""
        with self._errors():
            if self._sink is None and not self.files:
                self._open()
            if self._sink is not None:
                self._close_shard()
        return self.files


@contextmanager
def output_directory(dst: str, overwrite: bool, reads: Sequence[str] = ()) -> Iterator[str]:
    """Yield a temporary directory beside DST; rename it to DST only if the block succeeds.

    Before anything is created or deleted, DST is checked: it may not overlap what the command
    reads (`reads`, see refuse_overlap), and may exist only with `overwrite`. An exception, a
    KeyboardInterrupt, or a signal the caller turns into an exception (the command line does, for
    SIGINT and SIGTERM) removes the temporary directory and leaves DST as it was; this function
    never touches signal handlers itself. SIGKILL can leave a `.DST.tmp-*` directory behind but never
    touches DST. The OS refusing a write becomes a DestinationError naming DST. For an object-store
    DST the directory is local and uploaded at the end (see fs.upload_directory).
    """
    refuse_overlap(reads, {"DST": dst})
    check_destination(dst, overwrite)
    failed = f"{dst}: cannot write the output"
    if fs.is_uri(dst):
        with fs.write_errors(failed):
            tmp = tempfile.mkdtemp(prefix="batchtool-out-")
        try:
            yield tmp
            with fs.write_errors(failed):
                fs.upload_directory(tmp, dst, overwrite)
        finally:
            fs.remove_tree(tmp)
        return
    dst = os.path.abspath(dst)
    created = make_parents(dst, f"{dst}: cannot create the output directory")
    tmp = None
    try:
        with fs.write_errors(f"{dst}: cannot create the output directory"):
            tmp = fs.make_unique_dir(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-")
        yield tmp
        check_destination(dst, overwrite)
        with fs.write_errors(f"{dst}: cannot move the output into place"):
            _replace(tmp, dst, overwrite)
    except BaseException:
        if tmp is not None:
            fs.remove_tree(tmp)
        remove_if_empty(created)
        raise


def make_parents(path: str, failed: str) -> list[str]:
    """Create the missing parent directories of `path` (absolute): DST, a report file; return them, deepest first,
    for a failed run to remove (remove_if_empty). What stands in the way is a DestinationError '<failed>: why'."""
    missing = []
    parent = os.path.dirname(path)
    while not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise DestinationError(f"{failed}: {parent} is not a directory")
        missing.append(parent)
        parent = os.path.dirname(parent)
    try:
        with fs.write_errors(failed):
            for directory in reversed(missing):
                os.mkdir(directory)
    except BaseException:
        remove_if_empty(missing)
        raise
    return missing


def remove_if_empty(directories: Sequence[str]) -> None:
    """Remove directories a failed run made (make_parents), deepest first, unless something else now lies in them."""
    for directory in directories:
        with suppress(OSError):
            os.rmdir(directory)


def _replace(tmp: str, dst: str, overwrite: bool) -> None:
    """Rename the finished directory to DST. Without `overwrite`, one rename, which the OS does only onto no DST or
    an empty directory (atomically replaced); anything put in DST meanwhile makes it fail, as "destination exists".
    With it, an existing DST is moved aside first (and put back if the second rename fails); only then is the old
    one deleted."""
    if not overwrite or not os.path.lexists(dst):
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise DestinationExistsError(_EXISTS.format(dst=dst)) from exc
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.old-", dir=os.path.dirname(dst))
    aside = os.path.join(old, "dst")
    os.rename(dst, aside)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(aside, dst)
        os.rmdir(old)
        raise
    fs.remove_tree(old)


_EXISTS = "{dst}: destination exists (pass --overwrite to replace it)"


def destination_taken(dst: str) -> bool:
    """DST holds something a run could destroy: it exists, and is not an empty directory (which a run fills as if DST
    did not exist, with no --overwrite)."""
    return fs.exists(dst) and not fs.is_empty_dir(dst)


def check_destination(dst: str, overwrite: bool) -> None:
    """DST may exist only as an empty directory, or with `overwrite`, and only as a directory."""
    if not overwrite and destination_taken(dst):
        raise DestinationExistsError(_EXISTS.format(dst=dst))
    if fs.exists(dst) and not fs.is_dir(dst):
        raise DestinationExistsError(f"{dst}: destination exists and is not a directory; refusing to replace it")


def refuse_overlap(reads: Sequence[str], targets: dict[str, str | None]) -> None:
    """Never write where the command reads: each target (DST, the tmp dir; named by its option) may not
    be, contain or lie inside any path in `reads` (see fs.overlap for how paths are compared)."""
    for option, path in targets.items():
        found = fs.overlap(path, reads) if path is not None else None
        if found is not None:
            other, relation = found
            raise DestinationError(f"{option} {path} {relation} the input {other}; batchtool never writes where "
                                   "it reads: choose a place outside the input")
