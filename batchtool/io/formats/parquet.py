"""Parquet shards: row-group-wise reads with projection, and a batch-per-row-group writer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchtool.core import fs
from batchtool.io.dataset import Reading, shard_chunk
from batchtool.core.errors import InputError, first_line, where
from batchtool.io.formats.declared import DECLARED
from batchtool.io.formats.base import (DAMAGED, EncodedBatch, Format, ReadTask, StoredBatches, WriteOptions, cut,
                                       open_self_describing, schema_problem)
from batchtool.io.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    from batchtool.io.dataset import Chunk, Dataset, ReadReport, Shard

_CHECKSUM_FAILED = "CRC checksum verification failed"
"""What pyarrow says when a page's CRC32 (write_page_checksum) does not match its bytes."""
MAX_SHARD_BATCHES = 4096
"""Row groups per Parquet shard at most: each costs ~1 KB of footer that writer and reader hold in
memory, so shards of many small batches (segment's 32-row batches) roll over by count, not size."""
_DECODE_ROWS = 1024
"""Decoding a row group in pieces of this many rows and joining them needs far less transient memory
(and time) than decoding it whole: nested list columns decode with large temporary buffers."""


def open_file(path: str, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """Open one shard, turning pyarrow's errors into one-line InputErrors.

    Page checksums are verified wherever the file has them (batchtool's own output always
    does): a flipped bit is an error, not a changed value. `metadata` reuses a parsed footer.
    """
    try:
        return pq.ParquetFile(fs.open_input(path) if fs.is_uri(path) else path, metadata=metadata,
                              memory_map=False, page_checksum_verification=True)
    except DAMAGED as exc:
        raise InputError(f"{where(path)}: not a readable Parquet file ({first_line(exc)})") from exc


def read_row_group(path: str, row_group: int, columns: list[str] | None,
                   metadata: pq.FileMetaData | None = None) -> pa.RecordBatch:
    """Read one row group, only the asked columns, as a single RecordBatch; `metadata`: the file's footer, already
    parsed (parsing it again for every row group costs the whole footer each time: 8.6 ms a row group of a
    4,000-row-group file, 0.13 ms with it)."""
    pf = open_file(path, metadata)
    try:
        return decode_row_group(pf, row_group, columns)
    except DAMAGED as exc:
        raise unreadable(pf, path, [row_group], columns, exc) from exc


def unreadable(pf: pq.ParquetFile, path: str, row_groups: list[int], columns: list[str] | None,
               exc: BaseException) -> InputError:
    """The error for row groups that failed to decode, naming the row group and column that did."""
    for rg in row_groups:
        for column in columns if columns is not None else pf.schema_arrow.names:
            try:
                pf.read_row_group(rg, columns=[column], use_threads=False)
            except DAMAGED as column_exc:
                problem = ("a page checksum does not match: the file changed after it was written"
                           if _CHECKSUM_FAILED in str(column_exc) else first_line(column_exc))
                return InputError(f"{where(path)}, row group {rg}, column {column!r}: corrupt ({problem})")
    first, last = row_groups[0], row_groups[-1]
    groups = f"row group {first}" if first == last else f"row groups {first}..{last}"
    return InputError(f"{where(path)}: {groups} unreadable ({first_line(exc)})")


def decode_row_group(pf: pq.ParquetFile, row_group: int, columns: list[str] | None) -> pa.RecordBatch:
    """Decode one row group of an open file (in pieces, see _DECODE_ROWS) as a single RecordBatch."""
    pieces = list(pf.iter_batches(batch_size=_DECODE_ROWS, row_groups=[row_group], columns=columns,
                                  use_threads=False))
    return _one_batch(pa.Table.from_batches(pieces, pieces[0].schema if pieces else pf.schema_arrow))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth dictionary-encoding: flat ones (one value a row) that are not floats.

    The encoder keeps every distinct value of a page in a hash table before it can give up on
    a dictionary, and a page never ends inside a row: one row of 10^6 steps x 16 random floats
    took 1.2 GB for that and came out 53% larger than plain encoding (with zstd). Floats rarely
    repeat, and zstd already compresses token lists as well as a dictionary does.
    """
    return [f.name for f in schema if not pa.types.is_nested(f.type) and not pa.types.is_floating(f.type)]


class ParquetShardWriter:
    """Writes RecordBatches to one file, one row group per call, so a reader can fetch batch i directly."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, compression: str = "zstd",
                 compression_level: int | None = None) -> None:
        # Statistics only for flat columns: min/max of list columns are rarely used, and with one row
        # group per batch they would double the footer.
        flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
        # Page checksums let every reader (open_file) tell a flipped bit from data.
        self._writer = pq.ParquetWriter(sink, schema, compression=compression,
                                        compression_level=compression_level, use_dictionary=dictionary_columns(schema),
                                        write_statistics=flat, store_schema=True, write_page_checksum=True)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch, row_group_size=max(batch.num_rows, 1))

    def close(self) -> None:
        self._writer.close()


class _Sink:
    """A Parquet shard: one row group per batch."""

    def __init__(self, file: BinaryIO, schema: pa.Schema, codec: str) -> None:
        self._writer = ParquetShardWriter(file, schema, compression=codec)

    def write(self, encoded: EncodedBatch) -> None:
        self._writer.write(encoded.data)

    def close(self) -> dict:
        self._writer.close()
        return {}

    def abandon(self) -> None:
        self._writer.close()


def _footer(path: str) -> tuple[pa.Schema, int]:
    pf = open_file(path)
    return pf.schema_arrow, pf.metadata.num_rows


@dataclass(frozen=True)
class _Task:
    """One row group of a shard, read and decoded on a worker."""

    shard: Shard
    row_group: int
    first_row: int
    columns: list[str] | None
    schema: pa.Schema
    metadata: pq.FileMetaData | None = field(default=None, compare=False)
    """The shard's footer as the driver parsed it, shared by its tasks on local threads; a task sent to another
    process goes without it (a footer per task would make the bytes sent grow with the row groups squared)."""

    def __call__(self) -> Chunk:
        batch = read_row_group(self.shard.path, self.row_group, self.columns, self.metadata)
        return shard_chunk(batch, self.schema, self.shard, self.first_row)

    def __reduce__(self) -> tuple[Any, ...]:
        return _Task, (self.shard, self.row_group, self.first_row, self.columns, self.schema)


@dataclass(frozen=True)
class _Batches(StoredBatches):
    """Every non-empty row group is a batch."""

    paths: tuple[str, ...]
    counts: np.ndarray
    row_groups: tuple[np.ndarray | None, ...]
    """The row group of each of a file's batches; None when it is every row group in order."""
    records_buckets = True

    def footer(self, f: int, cache: dict) -> pq.FileMetaData:
        """File f's parsed footer, kept in `cache` (about 1 KB per column chunk: one block's files at a time)."""
        meta = cache.get(f)
        if meta is None:
            path = self.paths[f]
            meta = open_file(path).metadata
            expected = self.counts[f] if self.row_groups[f] is None else None
            if expected is not None and meta.num_row_groups != expected:
                raise InputError(f"{path}: has {meta.num_row_groups} row groups, but "
                                 f"{MANIFEST_NAME} lists {expected} batches for it")
            cache[f] = meta
        return meta

    def groups(self, f: int, local: np.ndarray) -> np.ndarray:
        groups = self.row_groups[f]
        return local if groups is None else groups[local]

    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        meta = self.footer(f, {})
        return np.array([meta.row_group(int(g)).num_rows for g in self.groups(f, local)], dtype=np.int64)

    def buckets(self, f: int, local: np.ndarray, column: str = "bucket") -> np.ndarray:
        """From the footer statistics of the bucket column."""
        meta = self.footer(f, {})
        index = meta.schema.names.index(column)
        out = np.full(len(local), -1, dtype=np.int64)
        for i, g in enumerate(self.groups(f, local)):
            stats = meta.row_group(int(g)).column(index).statistics
            if stats is not None and stats.has_min_max and stats.min == stats.max:
                out[i] = stats.min
        return out

    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict, verify: bool = False) -> _Read:
        return _Read(self.paths[f], self.footer(f, cache), tuple(int(g) for g in self.groups(f, local)), columns)


@dataclass(frozen=True)
class _Read(ReadTask):
    """Row groups of one file, decoded in one call (cheaper per batch) and cut back into one batch each."""

    path: str
    metadata: pq.FileMetaData
    row_groups: tuple[int, ...]
    columns: list[str] | None

    def __call__(self) -> list[pa.RecordBatch]:
        pf = open_file(self.path, self.metadata)  # the parsed footer is shared, not re-read
        try:
            table = pf.read_row_groups(list(self.row_groups), columns=self.columns, use_threads=False)
        except DAMAGED as exc:
            raise unreadable(pf, self.path, list(self.row_groups), self.columns, exc) from exc
        return cut(_one_batch(table), [self.metadata.row_group(rg).num_rows for rg in self.row_groups])


class ParquetFormat(Format, declared=DECLARED["parquet"]):
    """Parquet batch shards: one row group per batch, zstd by default."""

    max_shard_batches = MAX_SHARD_BATCHES
    magic = b"PAR1"
    group = "row group"
    min_batch_bytes = 8
    """A row group's entry in the footer: its column chunks, byte size and rows."""

    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: WriteOptions) -> _Sink:
        return _Sink(file, schema, options.codec)

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: Reading) -> Dataset:
        return open_self_describing(src, self, shards, schema, manifest, _footer)

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        return open_file(shard.path).metadata.num_rows

    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, _Batches]:
        """The manifest's batch counts (each checked against the footer when read), or for a Parquet directory
        without one, the footers' non-empty row groups."""
        paths = tuple(s.path for s in dataset.shards)
        if dataset.manifest:
            counts = np.array([e["batches"] for e in dataset.manifest["output"]["files"]], dtype=np.int64)
            return counts, _Batches(paths, counts, (None,) * len(paths))
        groups = []
        for path in paths:
            meta = open_file(path).metadata
            groups.append(np.array([g for g in range(meta.num_row_groups) if meta.row_group(g).num_rows],
                                   dtype=np.int64))
        counts = np.array([len(g) for g in groups], dtype=np.int64)
        return counts, _Batches(paths, counts, tuple(groups))

    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int, str | None]:
        """From the footer: every non-empty row group is a batch."""
        pf = open_file(path)
        meta = pf.metadata
        groups = sum(1 for rg in range(meta.num_row_groups) if meta.row_group(rg).num_rows)
        return meta.num_rows, groups, schema_problem(pf.schema_arrow, schema)

    def tasks(self, dataset: Dataset, columns: list[str] | None, report: ReadReport) -> Iterator[_Task]:
        schema = dataset.projected_schema(columns)
        for shard in dataset.shards:
            meta = open_file(shard.path).metadata
            first = 0
            for rg in range(meta.num_row_groups):
                rows = meta.row_group(rg).num_rows
                if rows:
                    yield _Task(shard, rg, first, columns, schema, meta)
                first += rows


FORMAT = ParquetFormat()
"""The format, as the registry (batchtool.io.formats.registry.FORMATS) lists it."""
