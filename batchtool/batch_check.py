"""What a record batch read from a shard must pass before anything slices it (O(offsets), never O(values)),
and the CRC32C of its buffers that the Arrow IPC writer records with every batch and `verify=True` checks."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import google_crc32c
import numpy as np
import pyarrow as pa

from batchtool.errors import InputError, where
from batchtool.formats.base import first_line

CRC_KEY = b"batchtool.crc32c"
"""The custom metadata key of an Arrow IPC record batch holding its CRC32C (8 hex digits)."""
CHECKSUMS = "crc32c"
"""What an output file's manifest entry says under `batch_checksums` when its batches carry CRC_KEY."""

_validate = True
"""Off only inside unchecked(): the benchmark's measure of what the checks cost."""


@contextmanager
def unchecked() -> Iterator[None]:
    """Skip check_batch in this block (private: the benchmark's `validation off`; nothing else may use it)."""
    global _validate
    _validate = False
    try:
        yield
    finally:
        _validate = True


class _Corrupt(Exception):
    """One array's defect; check_batch names the file, batch and column."""


def check_batch(batch: pa.RecordBatch, path: str, index: int) -> None:
    """InputError naming the file, the record batch and the column unless every buffer the batch's arrays read
    lies inside its buffer: sizes against lengths and null counts (Arrow's own structural validate), then every
    offsets buffer monotonic (with Arrow's check of its first and last offset, that bounds every offset by the
    child's length), and null counts against the validity bitmaps. Reads offsets and bitmaps, not values."""
    if not _validate:
        return
    try:
        batch.validate()
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(f"{where(path)}, record batch {index}: corrupt ({first_line(exc)})") from exc
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            _check_array(column)
        except (_Corrupt, pa.ArrowException, ValueError) as exc:
            raise InputError(f"{where(path)}, record batch {index}, column {name!r}: corrupt ({first_line(exc)})") \
                from exc


def _check_array(arr: pa.Array) -> None:
    kind = arr.type
    buffers = arr.buffers()
    _check_nulls(arr, buffers[0] if buffers else None)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        _check_offsets(arr, buffers[1], np.int64 if pa.types.is_large_list(kind) else np.int32)
        _check_array(arr.values)
    elif pa.types.is_fixed_size_list(kind):
        _check_array(arr.values)
    elif pa.types.is_string(kind) or pa.types.is_binary(kind):
        _check_offsets(arr, buffers[1], np.int32)
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        _check_offsets(arr, buffers[1], np.int64)
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
              or pa.types.is_temporal(kind) or pa.types.is_null(kind) or pa.types.is_fixed_size_binary(kind)
              or pa.types.is_decimal(kind)):
        arr.validate(full=True)  # structs, maps, dictionaries, unions: batchtool writes none; checked in full


def _check_nulls(arr: pa.Array, validity: pa.Buffer | None) -> None:
    """The declared null count is the bitmap's (a wrong one makes readers take nulls for values, or the reverse)."""
    if validity is None or pa.types.is_null(arr.type):
        return
    valid = pa.BooleanArray.from_buffers(pa.bool_(), len(arr), [None, validity], 0, arr.offset).true_count
    if len(arr) - valid != arr.null_count:
        raise _Corrupt(f"null count {arr.null_count}, but the validity bitmap marks {len(arr) - valid} nulls")


def _check_offsets(arr: pa.Array, offsets: pa.Buffer | None, dtype: type) -> None:
    if offsets is None or not len(arr):
        return
    values = np.frombuffer(offsets, dtype=dtype, count=arr.offset + len(arr) + 1)[arr.offset:]
    if (values[1:] < values[:-1]).any():
        row = int(np.flatnonzero(values[1:] < values[:-1])[0])
        raise _Corrupt(f"offsets decrease at row {row} ({values[row]} then {values[row + 1]})")


def batch_crc(batch: pa.RecordBatch) -> int:
    """CRC32C of a batch as a reader sees it: its rows, each column's null count, then every buffer of every
    array (children included) in order. The writer computes it on the batch read back from its IPC encoding,
    so both sides hash the same buffers."""
    head = struct.pack(f"<q{batch.num_columns}q", batch.num_rows, *(c.null_count for c in batch.columns))
    crc = google_crc32c.extend(0, head)
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is not None and buffer.size:
                crc = google_crc32c.extend(crc, buffer)
    return crc


def batch_crc_metadata(batch: pa.RecordBatch) -> dict[bytes, bytes]:
    """The custom metadata the Arrow IPC writer stores with `batch`: its CRC32C, as its reader will compute it."""
    readback = pa.ipc.read_record_batch(batch.serialize(), batch.schema)
    return {CRC_KEY: f"{batch_crc(readback):08x}".encode()}


def verify_crc(batch: pa.RecordBatch, metadata: pa.KeyValueMetadata | None, path: str, index: int) -> None:
    """InputError naming the file and batch unless `batch` (read whole, before any projection) has the CRC32C
    the writer recorded in its metadata."""
    recorded = None if metadata is None else metadata.get(CRC_KEY)
    if recorded is None:
        raise InputError(f"{where(path)}, record batch {index}: corrupt (no {CRC_KEY.decode()} checksum, which "
                         "batchtool writes with every batch)")
    found = f"{batch_crc(batch):08x}".encode()
    if found != recorded:
        raise InputError(f"{where(path)}, record batch {index}: corrupt (CRC32C {found.decode()}, the writer "
                         f"recorded {recorded.decode(errors='replace')}: the file changed after it was written)")

