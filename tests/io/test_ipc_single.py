"""ipc_single: one record batch written from buffers in pieces is the file pyarrow's writer gives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from batchtool.io.ipc_single import NO_VALIDITY, Buffer, write_single_batch


def pyarrow_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))
    return sink.getvalue().to_pybytes()


def in_pieces(data: bytes, size: int) -> Buffer:
    return Buffer(len(data), lambda: [data[i:i + size] for i in range(0, len(data), size)])


def body_buffers(column: pa.Array, size: int) -> list[Buffer]:
    """A column's IPC body buffers (no validity: no nulls), in pieces of `size` bytes."""
    if pa.types.is_large_string(column.type):
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[:len(column) + 1]
        characters = column.buffers()[2].to_pybytes()[:int(offsets[-1])] if len(column) else b""
        return [NO_VALIDITY, in_pieces(offsets.tobytes(), size), in_pieces(characters, size)]
    return [NO_VALIDITY, in_pieces(column.buffers()[1].to_pybytes()[:8 * len(column)], size)]


@settings(max_examples=40, deadline=None)
@given(keys=st.one_of(st.lists(st.text(max_size=5), max_size=40), st.lists(st.integers(-2**63, 2**63 - 1),
                                                                            max_size=40)),
       size=st.integers(3, 50))
def test_the_bytes_are_pyarrows(keys, size):
    key = pa.array(keys, pa.large_string() if keys and isinstance(keys[0], str) else pa.int64())
    n = len(keys)
    table = pa.table({"key": key, "batch": pa.array(np.arange(n) // 3), "by_key": pa.array(np.arange(n)[::-1].copy())})
    written: list[bytes] = []
    buffers = [b for column in table.columns for b in body_buffers(column.combine_chunks(), size)]
    write_single_batch(lambda piece: written.append(bytes(piece)), table.schema, n, buffers)
    assert b"".join(written) == pyarrow_file(table)


def test_a_buffer_shorter_than_it_said_is_refused():
    schema = pa.schema([("x", pa.int64())])
    with pytest.raises(ValueError, match="gave 8 bytes, not 16"):
        write_single_batch(lambda piece: None, schema, 2, [NO_VALIDITY, Buffer(16, lambda: [bytes(8)])])
