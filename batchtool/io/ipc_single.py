"""An Arrow IPC file of one record batch written from its column buffers in pieces, so a batch larger than memory
(an output's example index) is written in bounded memory, with the bytes pyarrow's own writer gives.

pyarrow writes a record batch only from buffers it holds whole. Here pyarrow writes the same schema with one row
(the template); the metadata of a batch of n rows differs from the template's only in fixed-width numbers (the
batch's length, each column's length and null count, each buffer's offset and length, the body's length), so
those are overwritten where the flatbuffers keep them (ipc_meta.Flat finds them) and the body is streamed
between the template's head and tail.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from batchtool.io.formats.ipc_meta import FILE_TRAILER, STRUCT_BYTES, Flat, file_footer

ALIGNMENT = 8
"""pyarrow's IPC writer pads every body buffer to a multiple of 8 bytes."""
_I64, _U32, _PAIR = struct.Struct("<q"), struct.Struct("<I"), struct.Struct("<qq")
_BLOCK_BODY = 16
"""Where a footer Block's bodyLength is in it (after offset int64, metaDataLength int32 and padding)."""
_MESSAGE_PREFIX = 8
"""A message's continuation marker and metadata length, before its flatbuffer."""


@dataclass(frozen=True)
class Buffer:
    """One body buffer: its length and a function giving its bytes in pieces, in order."""

    nbytes: int
    pieces: Callable[[], Iterable[bytes | memoryview]]


def _padded(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _empty() -> Iterable[bytes]:
    return ()


NO_VALIDITY = Buffer(0, _empty)
"""A column without nulls: pyarrow writes its validity bitmap as an empty buffer."""


def _template(schema: pa.Schema, rows: int) -> bytes:
    """pyarrow's IPC file of `rows` (0 or 1) rows of `schema` (flat columns, no nulls): one record batch, or none
    (as pyarrow writes an empty table)."""
    columns = [pa.array([""] * rows if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                        else [0] * rows, f.type) for f in schema]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.table(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def write_single_batch(write: Callable[[bytes | memoryview], object], schema: pa.Schema, rows: int,
                       buffers: Sequence[Buffer]) -> None:
    """Write, through `write`, the IPC file pyarrow's writer gives for one record batch of `rows` rows of `schema`
    (flat columns of fixed-width or string types, no nulls) whose body buffers are `buffers`, in the IPC order
    (per column: validity, then offsets and data, or values), each padded with zeros to ALIGNMENT."""
    template = bytearray(_template(schema, min(rows, 1)))
    if rows == 0:
        write(template)
        return
    view = bytes(template)
    footer = file_footer(lambda at, n: view[at:at + n], len(view))
    start, lengths, body = footer.batches[0].tolist()
    meta = lengths & 0xFFFFFFFF
    base = start + _MESSAGE_PREFIX
    flat = Flat(view[base:start + meta], "the template's record batch")
    message = flat.root()
    header = flat.target(message, 2)
    nodes, spans = flat.target(header, 1), flat.target(header, 2)
    if _U32.unpack_from(view, base + spans)[0] != len(buffers) or _U32.unpack_from(view, base + nodes)[0] != len(schema):
        raise ValueError("write_single_batch: the buffers do not match the schema's layout")
    offsets = np.cumsum([0] + [_padded(b.nbytes) for b in buffers]).tolist()
    _I64.pack_into(template, base + flat.field(message, 3), offsets[-1])  # Message.bodyLength
    _I64.pack_into(template, base + flat.field(header, 0), rows)  # RecordBatch.length
    for i in range(len(schema)):  # FieldNode: length, null_count
        _PAIR.pack_into(template, base + nodes + 4 + i * STRUCT_BYTES, rows, 0)
    for i, b in enumerate(buffers):  # Buffer: offset, length
        _PAIR.pack_into(template, base + spans + 4 + i * STRUCT_BYTES, offsets[i], b.nbytes)
    blocks = Flat(view[footer.end:len(view) - FILE_TRAILER], "the template's footer")
    batches = footer.end + blocks.target(blocks.root(), 3)
    _I64.pack_into(template, batches + 4 + _BLOCK_BODY, offsets[-1])  # Block.bodyLength
    write(memoryview(template)[:start + meta])
    for b in buffers:
        written = 0
        for piece in b.pieces():
            write(piece)
            written += memoryview(piece).nbytes
        if written != b.nbytes:
            raise ValueError(f"write_single_batch: a buffer gave {written:,} bytes, not {b.nbytes:,}")
        write(bytes(_padded(b.nbytes) - b.nbytes))
    write(memoryview(template)[start + meta + body:])


__all__ = ["ALIGNMENT", "NO_VALIDITY", "Buffer", "write_single_batch"]
