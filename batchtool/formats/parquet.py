"""Parquet shards: row-group-wise reads with projection, and a batch-per-row-group writer."""

from __future__ import annotations

from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchtool import fs
from batchtool.errors import InputError, where

_DECODE_ROWS = 1024
"""Decoding a row group in pieces of this many rows and joining them needs far less transient memory
(and time) than decoding it whole: nested list columns decode with large temporary buffers."""


def open_file(path: str) -> pq.ParquetFile:
    """Open one shard, turning pyarrow's errors into one-line InputErrors."""
    try:
        return pq.ParquetFile(fs.open_input(path) if fs.is_uri(path) else path, memory_map=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{where(path)}: not a readable Parquet file ({_first_line(exc)})") from exc


def read_row_group(path: str, row_group: int, columns: list[str] | None) -> pa.RecordBatch:
    """Read one row group, only the asked columns, as a single RecordBatch."""
    try:
        return decode_row_group(open_file(path), row_group, columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{where(path)}: row group {row_group} is unreadable ({_first_line(exc)})") from exc


def decode_row_group(pf: pq.ParquetFile, row_group: int, columns: list[str] | None) -> pa.RecordBatch:
    """Decode one row group of an open file (in pieces, see _DECODE_ROWS) as a single RecordBatch."""
    pieces = list(pf.iter_batches(batch_size=_DECODE_ROWS, row_groups=[row_group], columns=columns,
                                  use_threads=False))
    schema = pieces[0].schema if pieces else pf.schema_arrow
    batches = pa.Table.from_batches(pieces, schema).combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class ParquetShardWriter:
    """Writes RecordBatches to one file, one row group per call, so a reader can fetch batch i directly."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, compression: str = "zstd",
                 compression_level: int | None = None) -> None:
        # Statistics only for flat columns: min/max of list columns are rarely used, and with one row
        # group per batch they would double the footer.
        flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
        self._writer = pq.ParquetWriter(sink, schema, compression=compression,
                                        compression_level=compression_level,
                                        write_statistics=flat, store_schema=True)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch, row_group_size=max(batch.num_rows, 1))

    def close(self) -> None:
        self._writer.close()
