"""What a record batch read from a shard must pass before anything slices it (offsets, bitmaps and string bytes,
never numeric values), and the CRC32C of its buffers that the Arrow IPC writer records with every batch and `verify=True` checks."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import google_crc32c
import pyarrow as pa

from batchtool.core.errors import InputError, first_line, where

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


def check_batch(batch: pa.RecordBatch, path: str, index: int) -> None:
    """InputError naming the file, the record batch and the column unless every buffer the batch's arrays read
    lies inside its buffer: Arrow's full validation, which checks buffer sizes against lengths, every offset
    (monotonic, within the child), null counts against the validity bitmaps and strings' UTF-8, and reads no
    numeric value: a few microseconds a batch, in C++ (a check of the offsets in Python took ten times that)."""
    if not _validate:
        return
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                column.validate(full=True)
            except (pa.ArrowException, ValueError) as column_exc:
                raise InputError(f"{where(path)}, record batch {index}, column {name!r}: corrupt "
                                 f"({first_line(column_exc)})") from exc
        raise InputError(f"{where(path)}, record batch {index}: corrupt ({first_line(exc)})") from exc


def batch_crc(batch: pa.RecordBatch) -> int:
    """CRC32C of a batch as a reader sees it: its rows, each column's null count, then every buffer of every
    array (children included) in order. The writer computes it on the batch read back from its IPC encoding,
    so both sides hash the same buffers."""
    head = struct.pack(f"<q{batch.num_columns}q", batch.num_rows, *(c.null_count for c in batch.columns))
    crc = google_crc32c.extend(0, head)
    for buffer in batch.to_struct_array().buffers()[1:]:  # (every column's, depth first, fetched in one call)
        if buffer is not None:
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

