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
    array (children included) in order. The writer records it from the batch's own buffers as the reader will
    get them (batch_crc_metadata), so both sides hash the same bytes."""
    buffers = [b for b in batch.to_struct_array().buffers()[1:] if b is not None]  # every column's, depth first
    return _crc(batch.num_rows, batch.columns, buffers)


def _crc(rows: int, columns: list[pa.Array], buffers: list[pa.Buffer]) -> int:
    head = struct.pack(f"<q{len(columns)}q", rows, *(c.null_count for c in columns))
    crc = google_crc32c.extend(0, head)
    for buffer in buffers:
        crc = google_crc32c.extend(crc, buffer)
    return crc


def written_buffers(array: pa.Array) -> list[pa.Buffer] | None:
    """The buffers of `array`, children included, depth first, as an Arrow IPC reader gets them once the writer
    has written it: the array's own, less each validity bitmap of an array without nulls (the writer sends none).
    None where the writer would not send every buffer whole (an offset, a buffer longer than its values, list
    offsets that do not start at 0, a type not handled here): only a read-back shows those."""
    out: list[pa.Buffer] = []
    return out if _written(array, array.buffers(), 0, out) is not None else None


_FIXED_WIDTH = (pa.NumericArray, pa.FixedSizeBinaryArray)
"""Arrays of one value buffer of a fixed width (integers, floats, temporals, decimals, fixed-size binary)."""
_VARIABLE = {pa.StringArray: "<i", pa.BinaryArray: "<i", pa.LargeStringArray: "<q", pa.LargeBinaryArray: "<q"}
_LISTS = {pa.ListArray: "<i", pa.LargeListArray: "<q"}
"""Offsets then values (bytes or a child array): the format of one offset."""


def _written(array: pa.Array, buffers: list[pa.Buffer | None], i: int, out: list[pa.Buffer]) -> int | None:
    """Append `array`'s buffers (`buffers[i:]`, its flattened buffers) to `out` as written_buffers says; the index
    of the next array's first buffer, or None where the writer would not send them whole."""
    rows = len(array)
    if array.offset:
        return None
    if isinstance(array, pa.ExtensionArray):
        return _written(array.storage, buffers, i, out)
    bitmap_bytes = (rows + 7) // 8
    if array.null_count:
        if not _exact(buffers[i], bitmap_bytes, out):
            return None
    i += 1
    kind = type(array)
    if kind is pa.BooleanArray:
        return i + 1 if _exact(buffers[i], bitmap_bytes, out) else None
    if isinstance(array, _FIXED_WIDTH):
        return i + 1 if _exact(buffers[i], rows * (array.type.bit_width // 8), out) else None
    offset_format = _VARIABLE.get(kind) or _LISTS.get(kind)
    if offset_format is not None:
        width = struct.calcsize(offset_format)
        offsets = buffers[i]
        if offsets is None or offsets.size != (rows + 1) * width or struct.unpack_from(offset_format, offsets)[0]:
            return None
        end = struct.unpack_from(offset_format, offsets, rows * width)[0]
        out.append(offsets)
        if kind in _VARIABLE:
            return i + 2 if _exact(buffers[i + 1], end, out) else None
        return _written(array.values, buffers, i + 1, out) if len(array.values) == end else None
    if kind is pa.FixedSizeListArray:
        child = array.values
        return _written(child, buffers, i, out) if len(child) == rows * array.type.list_size else None
    if kind is pa.StructArray:
        for field in range(array.type.num_fields):
            child = array.field(field)
            i = _written(child, buffers, i, out) if len(child) == rows else None
            if i is None:
                return None
        return i
    return None


def _exact(buffer: pa.Buffer | None, size: int, out: list[pa.Buffer]) -> bool:
    """Append `buffer` if it holds exactly `size` bytes, as the writer then sends it (none where there are none)."""
    if buffer is None:
        return not size
    if buffer.size != size:
        return False
    out.append(buffer)
    return True


def batch_crc_metadata(batch: pa.RecordBatch, buffers: list[list[pa.Buffer] | None] | None = None,
                       columns: list[pa.Array] | None = None) -> dict[bytes, bytes]:
    """The custom metadata the Arrow IPC writer stores with `batch`: its CRC32C, as its reader will compute it.
    From the batch's own buffers (`buffers`: each column's written_buffers, where the caller has them) without a
    copy; where the writer would not send some column's buffers whole, from the batch serialized and read back.
    `columns`: batch.columns where the caller has them (each call of it makes every column's object again)."""
    columns = batch.columns if columns is None else columns
    if buffers is None:
        buffers = [written_buffers(c) for c in columns]
    if any(b is None for b in buffers):
        return {CRC_KEY: f"{batch_crc(pa.ipc.read_record_batch(batch.serialize(), batch.schema)):08x}".encode()}
    return {CRC_KEY: f"{_crc(batch.num_rows, columns, [b for column in buffers for b in column]):08x}".encode()}


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

