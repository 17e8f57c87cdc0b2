"""TFRecord as a batchtool format: shards opened as datasets (schema from the manifest or a scan of every record),
read by tasks that frame, check and decode their own records where they run, written as outputs, and read back
batch by batch through the manifest's batch index."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa

from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES, check_record_limit
from batchtool.io.dataset import Dataset, OneChunk, Reading, shard_chunk
from batchtool.core.errors import CorruptRecordError, InputError, OptionError, where
from batchtool.io.formats import example as example_codec
from batchtool.io.formats.declared import DECLARED, TFRECORD_KINDS
from batchtool.io.formats.base import (BATCH_COLUMN, EncodedBatch, Format, ReadTask, StoredBatches, WriteOptions,
                                       cut)
from batchtool.io.formats.tfrecord.framing import FRAMING, frame_record
from batchtool.io.formats.tfrecord.records import (OnCorrupt, RangeReader, Span, iter_record_chunks, iter_record_spans,
                                               iter_records)
from batchtool.io.formats.tfrecord.stream import MAX_GZIP_RATIO, detect_compression
from batchtool.io.formats.tfrecord.writer import Sink, decode_batch_index
from batchtool.io.manifest import MANIFEST_NAME, schema_from_json
from batchtool.core.options import Choice, option
from batchtool.core.runner import Executor

if TYPE_CHECKING:
    from batchtool.io.dataset import Chunk, ReadReport, Shard


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
        first = self.records.first_record
        batch = example_codec.decode_records(self.records.payloads(), self.schema, self.kind, path=self.shard.path,
                                             first_record=first)
        return shard_chunk(batch, self.schema, self.shard, first, "record")


@dataclass(frozen=True)
class _ScanTask:
    """A step of the schema pass: a chunk's feature names, kinds and counts, found where the task runs."""

    records: _Records
    kind: str

    def __call__(self) -> example_codec.FeatureScan:
        return example_codec.scan_records(self.records.payloads(), self.kind, path=self.records.path,
                                          first_record=self.records.first_record)


@dataclass(frozen=True)
class FileTask:
    """One whole file, framed, CRC-checked and decoded by whoever runs it: a worker of a distributed pass
    (batchtool.exec.exchange), so the records never pass through the driver."""

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
                 max_record_bytes: int, executor: Executor) -> tuple[pa.Schema, str]:
    """The schema of every feature of every record: one pass over names, kinds and counts, not values, in steps
    that run on the executor (the records of uncompressed files are read there), merged here in file order.

    Corrupt records skipped here are skipped (and counted) again by the pass that reads the data.
    """
    steps = (_ScanTask(records, kind) for shard in shards
             for records in _file_records(shard.path, SCAN_RECORDS, SCAN_BYTES, skip_corrupt, None, max_record_bytes))
    scan = example_codec.FeatureScan()
    for found in executor.map(_scanned, steps):
        scan = scan.merge(found)
    if not scan.records:
        raise InputError(f"{src}: empty input: no TFRecord records to infer a schema from")
    return scan.schema(kind, src)


def _scanned(step: _ScanTask) -> example_codec.FeatureScan:
    return step()


def _schema_problem(payloads: list[bytes], path: str, schema: pa.Schema, kind: str) -> str | None:
    """How a file's first records differ from `schema`: they do not decode to it, or hold features it lacks."""
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
class _Batches(StoredBatches):
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
        path = self.paths[f]
        reader = cache.get(f)
        if reader is None:
            reader = cache[f] = RangeReader(path)
        ranges = self.ranges[f]
        payloads: list[bytes] = []
        rows = []
        for i in local:
            (start, first), (end, stop) = ranges[i], ranges[i + 1]
            records = reader.records(int(start), int(end), int(first), label=f"batch {int(i)}")
            if len(records) != stop - first:
                raise InputError(f"{path}, batch {int(i)}: bytes {start}..{end} hold {len(records)} records, but "
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
        decoded = example_codec.decode_records(self.payloads, self.schema, self.kind, path=self.path,
                                               first_record=self.first_record)
        return cut(decoded, self.rows)


def _narrowed(batch: pa.RecordBatch, options: WriteOptions) -> pa.RecordBatch:
    """The values written: --cast's narrowing (an extension type's values are its storage's)."""
    stored = options.narrowed_schema(batch.schema)
    return batch if stored == batch.schema else batch.cast(stored)


def _lists(options: WriteOptions) -> tuple[str, ...] | None:
    """An op's feature lists: they matter to SequenceExample records only (tf.train.Example has none)."""
    return options.sequence_columns if options.writing.tfrecord_kind == "sequence_example" else None


@dataclass(frozen=True)
class TFRecordReading:
    """How TFRecord files are read (TFRecordFormat.read_options)."""

    tfrecord_kind: str = option("Payload of the records (auto: found by the schema pass; a batchtool output's "
                                "manifest says).", Choice(("auto", *TFRECORD_KINDS)), "auto")


def _kind(dataset: Dataset) -> str:
    """The payload a dataset's records were found to hold."""
    return dataset.options.tfrecord_kind if dataset.options is not None else "sequence_example"


class TFRecordFormat(Format, declared=DECLARED["tfrecord"]):
    """TFRecord shards of tf.train.SequenceExample (or Example) records, directly batchable by tf.data."""

    unit = "record"
    self_indexing = False
    read_options = TFRecordReading

    def most_batches(self, size: int, codec: str | None) -> int:
        """A batch is a record at least (a header and a data CRC) in the record stream, which gzip may have made up to
        MAX_GZIP_RATIO times smaller."""
        return size * (MAX_GZIP_RATIO if codec == "gzip" else 1) // FRAMING

    def suffix(self, codec: str) -> str:
        return ".tfrecord.gz" if codec == "gzip" else ".tfrecord"

    def check_options(self, options: WriteOptions) -> None:
        if options.codec not in self.codecs:
            raise OptionError("compression", f"{{compression}} {options.compression!r}: TFRecord takes gzip or none")

    def recorded_output(self, options: WriteOptions) -> dict[str, Any]:
        return {"tfrecord_kind": options.writing.tfrecord_kind}

    def encode(self, batch: pa.RecordBatch, options: WriteOptions) -> EncodedBatch:
        return self.encode_many([batch], options)[0]

    def encode_many(self, batches: Sequence[pa.RecordBatch], options: WriteOptions) -> list[EncodedBatch]:
        """One encode_records call over the batches' rows together (a record is a function of its row alone), cut
        back into batches: the codec's NumPy passes cost per call, and a segment batch holds a few rows."""
        batches = [_narrowed(batch, options) for batch in batches]
        whole = batches[0]
        if len(batches) > 1 and sum(batch.num_rows for batch in batches):
            whole = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        payloads = example_codec.encode_records(whole, options.writing.tfrecord_kind, sequence_columns=_lists(options))
        out, start = [], 0
        for batch in batches:
            end = start + batch.num_rows
            out.append(EncodedBatch(batch, b"".join(frame_record(p) for p in payloads[start:end])))
            start = end
        return out

    def check_values(self, batch: pa.RecordBatch, options: WriteOptions) -> None:
        example_codec.check_values(_narrowed(batch, options), options.writing.tfrecord_kind,
                                   sequence_columns=_lists(options))

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: WriteOptions) -> Sink:
        return Sink(file, options.codec)

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: Reading) -> Dataset:
        """Without a schema, the manifest's (a batchtool output), else a scan of every record."""
        limit = check_record_limit(DEFAULT_MAX_RECORD_BYTES if reading.max_record_bytes is None
                                   else reading.max_record_bytes)
        kind = (reading.options or TFRecordReading()).tfrecord_kind
        if schema is None and manifest and manifest.get("schema"):
            schema = schema_from_json(manifest["schema"])
            kind = manifest.get("output", {}).get("tfrecord_kind", kind)
        if schema is None:
            schema, kind = _scan_schema(src, shards, kind, reading.skip_corrupt, limit, reading.executor)
        elif kind == "auto":
            kind = "sequence_example"
        return Dataset(src, self, shards, schema, options=TFRecordReading(kind), skip_corrupt=reading.skip_corrupt,
                       manifest=manifest, max_record_bytes=limit)

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        """Every record read and CRC-checked."""
        return sum(1 for _ in iter_records(shard.path, skip_corrupt=dataset.skip_corrupt, on_corrupt=report.record,
                                           max_record_bytes=dataset.max_record_bytes))

    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, _Batches]:
        """From the batch index in the manifest (outputs of batchtool 0.1 have none: a scan of the `batch`
        column finds it); without a manifest, an InputError."""
        if not dataset.manifest:
            raise InputError(f"{dst}: TFRecord batches need the {MANIFEST_NAME} batchtool wrote beside them")
        output = dataset.manifest["output"]
        kind = _kind(dataset)
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

    def units(self, dataset: Dataset, columns: list[str] | None,
              report: ReadReport) -> Iterator[FileTask | OneChunk]:
        """Its read tasks, but a GZIP file whole, so that its framing too runs on a worker (a gzip stream is read
        from its start), and with skip_corrupt every file whole, so that what each skips comes back with its
        map output, in file order."""
        for file in self.file_tasks(dataset, columns):
            if file.compressed or dataset.skip_corrupt:
                yield file
            else:
                yield from map(OneChunk, file.tasks(report))

    def file_tasks(self, dataset: Dataset, columns: list[str] | None) -> Iterator[FileTask]:
        """One task per file, which frames its records where it runs (see units)."""
        schema = dataset.projected_schema(columns)
        for shard in dataset.shards:
            yield FileTask(shard, schema, _kind(dataset), dataset.skip_corrupt,
                           dataset.max_record_bytes)


FORMAT = TFRecordFormat()
"""The format, as the registry (batchtool.io.formats.registry.FORMATS) lists it."""
