"""The CRC32C the Arrow IPC writer records with a batch, taken from the batch's own buffers without a read-back copy,
is exactly what a reader of the written batch computes: for every column shape, sliced, offset or rebuilt."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import record_batches

from batchtool.core.errors import InputError
from batchtool.io import batch_check
from batchtool.io.formats.arrow import _has_bitmap
from batchtool.io.output import OutputOptions, encode_batches


def _large(t: pa.DataType) -> pa.DataType:
    """The same shape with 64-bit offsets: large lists, large strings and binaries."""
    if pa.types.is_list(t):
        return pa.large_list(_large(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_large(t.value_type), t.list_size)
    return {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}.get(t, t)


def _rebuilt(column: pa.Array) -> pa.Array:
    """A list column at offset 0 whose offsets do not start at 0 and whose child is longer than they reach (what
    ListArray.from_arrays makes of a slice's offsets), or a column whose validity bitmap is there without nulls."""
    if pa.types.is_list(column.type):
        return pa.ListArray.from_arrays(column.offsets, column.values)
    if pa.types.is_int64(column.type) and len(column) and not column.null_count:
        bitmap = pa.py_buffer(b"\xff" * ((len(column) + 7) // 8))
        return pa.Array.from_buffers(column.type, len(column), [bitmap, column.buffers()[1]], null_count=0)
    return column


@st.composite
def varied_batches(draw: st.DrawFn) -> pa.RecordBatch:
    """record_batches made harder: cut at any offset, with 64-bit offsets, wrapped in a struct, rebuilt lists,
    bitmaps without nulls, a JSON extension column."""
    batch = draw(record_batches())
    start = draw(st.integers(0, batch.num_rows))
    batch = batch.slice(start, draw(st.integers(min(1, batch.num_rows - start), batch.num_rows - start)))
    columns, names = list(batch.columns), list(batch.schema.names)
    if draw(st.booleans()):
        columns = [c.cast(_large(c.type)) for c in columns]
    if draw(st.booleans()):
        columns = [_rebuilt(c) for c in columns]
    if draw(st.booleans()):
        columns.append(pa.StructArray.from_arrays(columns, names=names))
        names.append("nested")
    if draw(st.booleans()):
        text = pc.cast(pa.array(range(len(columns[0]))), pa.string())
        columns.append(pa.ExtensionArray.from_storage(pa.json_(), text))
        names.append("json")
    return pa.RecordBatch.from_arrays(columns, names=names)


def _read_back(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(batch.serialize(), batch.schema)


def _contents(buffers: list[pa.Buffer | None]) -> list[bytes]:
    """What a CRC32C of `buffers` covers: their bytes in order (an empty or absent buffer adds none)."""
    return [b.to_pybytes() for b in buffers if b is not None and b.size]


def _compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


@settings(max_examples=150, deadline=None)
@given(batch=varied_batches())
def test_the_buffers_the_writer_sends_are_the_ones_a_reader_gets(batch):
    """written_buffers, where it answers, is byte for byte what a reader of the batch's IPC encoding gets for that
    column; so the recorded CRC32C, from the batch as it is or compacted, is the reader's."""
    for candidate in (batch, _compact(batch)):
        for column, got in zip(candidate.columns, _read_back(candidate).columns):
            written = batch_check.written_buffers(column)
            if written is not None:
                assert _contents(written) == _contents(got.buffers())
        expected = f"{batch_check.batch_crc(_read_back(candidate)):08x}".encode()
        assert batch_check.batch_crc_metadata(candidate) == {batch_check.CRC_KEY: expected}


COMPACT_COLUMNS = {
    "int64": pa.array([1, None, 3], pa.int64()),
    "float32": pa.array([1.5, 2.5, 3.5], pa.float32()),
    "bool": pa.array([True, None, False]),
    "string": pa.array(["a", None, "ccc"]),
    "large_binary": pa.array([b"a", b"", b"cc"], pa.large_binary()),
    "decimal": pa.array([1, 2, None], pa.decimal128(5, 2)),
    "timestamp": pa.array([1, 2, 3], pa.timestamp("ms")),
    "list": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
    "large_list": pa.array([[1, 2], [], [3]], pa.large_list(pa.int32())),
    "list_of_fixed": pa.array([[[1.0, 2.0]], [[3.0, None]], None], pa.list_(pa.list_(pa.float32(), 2))),
    "nested": pa.array([[[1], [2, 3]], [[4]], [[5]]], pa.list_(pa.list_(pa.int64()))),
    "struct": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}]),
    "json": pa.ExtensionArray.from_storage(pa.json_(), pa.array(["1", "[2]", None])),
}


@pytest.mark.parametrize("name", COMPACT_COLUMNS)
def test_a_compact_column_of_every_shape_is_checksummed_without_a_copy(name, monkeypatch):
    """What encode hands the writer (compact columns) never goes through the serialize-and-read-back."""
    column = COMPACT_COLUMNS[name]
    batch = pa.record_batch({name: column})
    expected = batch_check.batch_crc_metadata(batch)
    assert batch_check.written_buffers(column) is not None
    monkeypatch.setattr(pa.ipc, "read_record_batch", lambda *args: pytest.fail("read a compact batch back"))
    assert batch_check.batch_crc_metadata(batch) == expected


CUT = {
    "sliced": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64())).slice(1, 1),
    "cut short": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64())).slice(0, 2),
    "child longer than its offsets reach": pa.ListArray.from_arrays(pa.array([0, 1, 3], pa.int32()),
                                                                     pa.array([9, 8, 7, 6])),
    "offsets not from 0": pa.ListArray.from_arrays(pa.array([2, 3, 5], pa.int32()), pa.array([9, 8, 7, 6, 5])),
    "string bytes past the last offset": pa.StringArray.from_buffers(2, pa.py_buffer(b"\0\0\0\0\1\0\0\0\2\0\0\0"),
                                                                     pa.py_buffer(b"abc")),
}


@pytest.mark.parametrize("name", CUT)
def test_a_column_the_writer_would_cut_is_checksummed_from_a_read_back(name):
    batch = pa.record_batch({name: CUT[name]})
    assert batch_check.written_buffers(CUT[name]) is None
    expected = f"{batch_check.batch_crc(_read_back(batch)):08x}".encode()
    assert batch_check.batch_crc_metadata(batch) == {batch_check.CRC_KEY: expected}


@settings(max_examples=60, deadline=None)
@given(batch=varied_batches(), codec=st.sampled_from(["none", "lz4", "zstd"]))
def test_encode_records_the_crc_a_reader_of_the_file_verifies(batch, codec):
    """Written through the format's sink and read back from the file, every batch passes verify_crc; and encode
    passes on untouched the columns the writer sends whole (no copy), copying only those it must compact."""
    options = OutputOptions(format="arrow", compression=codec)
    encoded = next(encode_batches([batch], options))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, encoded.data.schema,
                         options=pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)) as writer:
        writer.write_batch(encoded.data, custom_metadata=encoded.metadata)
    reader = pa.ipc.open_file(sink.getvalue())
    read = reader.get_batch_with_custom_metadata(0)
    batch_check.verify_crc(read.batch, read.custom_metadata, "part-00000.arrow", 0)
    assert read.batch.equals(batch)
    for before, after in zip(batch.columns, encoded.data.columns):
        if batch_check.written_buffers(before) is not None and not _has_bitmap(before):
            assert [b.address for b in after.buffers() if b] == [b.address for b in before.buffers() if b]


def test_a_changed_byte_fails_verification():
    batch = pa.record_batch({"steps": pa.array([[1, 2], [3]], pa.list_(pa.int64()))})
    metadata = pa.KeyValueMetadata(batch_check.batch_crc_metadata(batch))
    values = bytearray(batch.column(0).values.buffers()[1].to_pybytes())
    values[0] ^= 1
    changed = pa.ListArray.from_arrays(batch.column(0).offsets, pa.Array.from_buffers(
        pa.int64(), 3, [None, pa.py_buffer(bytes(values))]))
    batch_check.verify_crc(batch, metadata, "f.arrow", 0)
    with pytest.raises(InputError, match=r"f\.arrow, record batch 0: corrupt \(CRC32C"):
        batch_check.verify_crc(pa.record_batch({"steps": changed}), metadata, "f.arrow", 0)
