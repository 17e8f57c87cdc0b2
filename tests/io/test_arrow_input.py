"""Arrow IPC input, file and stream format: sizes a file declares (a compressed buffer's length, a row count, what its
dictionaries decode to) are read from its metadata and checked before anything is decompressed or allocated; errors
name the record batch; dictionary-encoded columns (also from Parquet) are read as their values by every command."""

from __future__ import annotations

import io
import os
import re
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlimit
from batchtool.core.errors import BatchtoolError
from batchtool.io.formats import column_types, ipc_meta
from batchtool.io.inputs import open_dataset
from conftest import read_dir
from dirstate import listing, snapshot
from ipc_bombs import write_bomb

_CAP = 350 << 20
"""A child reading a 2 GiB bomb must stay far below it (it starts at about 90 MiB)."""
BOMB_ROWS = 2**28


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module", params=["file", "stream"])
def bomb(request, tmp_path_factory) -> str:
    """65 KB of Arrow IPC whose one record batch inflates to 2 GiB of int64 zeros."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.arrow"
    return str(write_bomb(path, 8 * BOMB_ROWS, stream=request.param == "stream"))


def test_inspect_counts_a_bomb_from_its_metadata_without_inflating_it(bomb):
    assert os.path.getsize(bomb) < 70_000
    run = memlimit.batchtool("inspect", bomb, "--json", limit_bytes=_CAP)
    assert run.returncode == 0, run.stderr
    assert f'"rows": {BOMB_ROWS}' in run.stdout and run.peak_bytes < _CAP


@pytest.mark.parametrize("command, limit", [
    (["convert"], "more than the limit of 16,777,216 \\(--max-record-bytes\\); raise --max-record-bytes"),
    (["shuffle"], "takes about 4.0 GB at once, more than --memory 1.0 GB allows \\(128.0 MB\\); give a larger "
                  "--memory"),
])
def test_a_command_refuses_a_bomb_before_inflating_it(bomb, tmp_path, command, limit):
    dst = tmp_path / "out" / "dst"
    (tmp_path / "out").mkdir()
    before = snapshot(tmp_path / "out"), listing(tmp_path / "out")
    run = memlimit.batchtool(*command, bomb, str(dst), limit_bytes=_CAP)
    assert run.returncode == 2 and run.peak_bytes < _CAP, run.stderr
    line = one_line(run.stderr)
    assert line.startswith(f"error: {bomb}, record batch 0: reading it (its buffers decompressed, "
                           f"{BOMB_ROWS:,} row ids) takes ")
    assert re.search(limit, line), line
    assert (snapshot(tmp_path / "out"), listing(tmp_path / "out")) == before


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_within_the_limit_is_read_and_one_beyond_it_is_named(tmp_path, run_cli, stream):
    src = str(write_bomb(tmp_path / "zeros.arrow", 8 * 300_000, stream=stream))  # 2.4 MB + 2.4 MB of row ids
    assert run_cli("convert", src, tmp_path / "ok", "-q").exit_code == 0
    assert read_dir(str(tmp_path / "ok")).column("x").to_pylist() == [0] * 300_000
    result = run_cli("convert", src, tmp_path / "bad", "--max-record-bytes", "4MB")
    assert one_line(result.stderr) == (
        f"error: {src}, record batch 0: reading it (its buffers decompressed, 300,000 row ids) takes 4,800,000 "
        "bytes, more than the limit of 4,194,304 (--max-record-bytes); raise --max-record-bytes if the data is "
        "genuine, or write the file in smaller record batches")
    assert result.exit_code == 2 and not (tmp_path / "bad").exists()


def test_a_row_count_no_buffer_backs_is_refused_before_its_row_ids_are_made(tmp_path, run_cli):
    """A column of the null type has no buffers: only its declared length says how many rows there are."""
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, pa.schema([("n", pa.null())])) as writer:
        writer.write_batch(pa.record_batch([pa.nulls(3)], names=["n"]))
    data = sink.getvalue().replace((3).to_bytes(8, "little"), (1 << 40).to_bytes(8, "little"))
    (tmp_path / "nulls.arrow").write_bytes(data)
    result = run_cli("convert", tmp_path / "nulls.arrow", tmp_path / "out")
    assert "record batch 0: reading it (no decompression, 1,099,511,627,776 row ids) takes" in one_line(result.stderr)
    assert not (tmp_path / "out").exists()


def _ipc(stream: bool, codec: str | None) -> bytes:
    batch = pa.record_batch({"a": pa.array(range(50)), "s": pa.array([f"v{i}" for i in range(50)]),
                             "l": pa.array([[i, None] for i in range(50)]),
                             "d": pa.array(["x", "y"] * 25).dictionary_encode()})
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch.slice(10, 5))
    return sink.getvalue()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("codec", [None, "zstd", "lz4"])
def test_the_metadata_reader_finds_what_pyarrow_reads(stream, codec):
    data = _ipc(stream, codec)
    layout = (ipc_meta.stream_layout if stream else ipc_meta.file_layout)(lambda at, n: data[at:at + n], len(data))
    assert [m.rows for m in layout.batches] == [50, 5] and len(layout.dictionaries) == 1
    reader = (pa.ipc.open_stream if stream else pa.ipc.open_file)(pa.py_buffer(data))
    schema = reader.schema
    for message in layout.batches:
        assert len(ipc_meta.field_buffers(schema, message, schema.names)) == len(message.buffers)
    inflated = [ipc_meta.inflated(lambda at, n: data[at:at + n], m) for m in layout.batches]
    assert (inflated[0] > 0) == (codec is not None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=st.booleans(), codec=st.sampled_from([None, "zstd"]), data=st.data())
def test_damaged_metadata_is_one_error_or_a_read(tmp_path_factory, stream, codec, data):
    """Any byte of the file changed (a length, an offset, a vtable): reading it either works or raises one
    BatchtoolError; never another exception, a read out of bounds or an allocation the file did not justify."""
    raw = bytearray(_ipc(stream, codec))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("damaged") / "d.arrow"
    path.write_bytes(bytes(raw))
    try:
        dataset = open_dataset(str(path))
        for _ in dataset.chunks():
            pass
    except BatchtoolError:
        pass


def _dictionary_table(encoded: bool) -> pa.Table:
    """Sequences with a string key, an integer label and a list of tags: dictionary-encoded (as pandas categoricals
    and many Arrow writers store them), or plain."""
    n = 24
    table = pa.table({"tokens": pa.array([list(range(1 + i % 5)) for i in range(n)]),
                      "key": pa.array([f"k{i}" for i in range(n)]), "label": pa.array([i % 3 for i in range(n)]),
                      "tags": pa.array([["a", "b"][: i % 3] for i in range(n)])})
    if not encoded:
        return table
    tags = pa.ListArray.from_arrays(table["tags"].combine_chunks().offsets,
                                    table["tags"].combine_chunks().values.dictionary_encode())
    return pa.table({"tokens": table["tokens"], "key": table["key"].dictionary_encode(),
                     "label": table["label"].dictionary_encode(), "tags": tags})


def _write_as(table: pa.Table, path, kind: str) -> str:
    """`table` as a file of `kind`: an IPC file or stream, a Parquet file, or (hf) a `save_to_disk` directory: a
    stream file its state.json lists."""
    if kind == "hf":
        os.makedirs(path)
        (path / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
        _write_as(table, path / "data-00000-of-00001.arrow", "stream")
        return str(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=10)  # pyarrow reads the strings back as dictionaries
    else:
        with (pa.ipc.new_stream if kind == "stream" else pa.ipc.new_file)(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=10)  # a dictionary batch, then record batches of indices
    return str(path)


def _file_schema(path: str, kind: str) -> pa.Schema:
    """The schema as pyarrow reads the file (what batchtool is given)."""
    if kind == "hf":
        return _file_schema(os.path.join(path, "data-00000-of-00001.arrow"), "stream")
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(path)
    return (pa.ipc.open_stream if kind == "stream" else pa.ipc.open_file)(path).schema


_DICTIONARY_COMMANDS = {
    "bucket": ["bucket", "--sequence", "tokens", "--boundaries", "2,4", "--batch-size", "3"],
    "segment": ["segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "2", "--batch-size", "4",
                "--context", "label,tags"],
    "stratify": ["stratify", "--label", "label", "--target", "uniform", "--balanced-batches", "--batch-size", "3"],
    "convert": ["convert", "--to", "arrow"],
}


@pytest.mark.parametrize("kind", ["file", "stream", "hf", "parquet"])
def test_dictionary_encoded_columns_are_read_as_their_values_by_every_command(tmp_path, run_cli, kind):
    """A key, a label and a list of tags dictionary-encoded give every command the output of the same values
    plain: decoded as read (the ops take values; a batch's own dictionaries could not be written across batches)."""
    suffix = {"parquet": ".parquet", "hf": ""}.get(kind, ".arrow")
    encoded = _write_as(_dictionary_table(True), tmp_path / f"encoded{suffix}", kind)
    plain = _write_as(_dictionary_table(False), tmp_path / f"plain{suffix}", kind)
    assert pa.types.is_dictionary(_file_schema(encoded, kind).field("key").type)
    for name, args in _DICTIONARY_COMMANDS.items():
        outputs = []
        for src in (encoded, plain):
            dst = tmp_path / f"{name}-{os.path.basename(src)}"
            result = run_cli(args[0], src, dst, *args[1:], "-q")
            assert result.exit_code == 0, (name, result.stderr)
            outputs.append(read_dir(str(dst)))
        assert outputs[0].num_rows > 0 and outputs[0].equals(outputs[1]), name


def test_a_dictionary_entry_repeated_past_the_limit_is_refused_before_it_is_decoded(tmp_path):
    """400 KB of indices all naming one 1 MB entry: 100 GB decoded. The decoded size is counted from the indices and
    the entry's length, in a child capped far below it."""
    indices = pa.array(np.zeros(100_000, dtype=np.int32))
    table = pa.table({"tokens": pa.array([[1]] * 100_000),
                      "key": pa.DictionaryArray.from_arrays(indices, pa.array(["x" * 1_000_000]))})
    src = str(tmp_path / "repeated.arrow")
    with pa.ipc.new_file(src, table.schema) as writer:
        writer.write_table(table)
    run = memlimit.batchtool("convert", src, str(tmp_path / "out"), limit_bytes=_CAP)
    assert run.returncode == 2 and run.peak_bytes < _CAP, run.stderr
    assert one_line(run.stderr) == (
        f"error: {src}, record batch 0: reading it (its dictionaries decoded, 100,000 row ids) takes 100,001,200,000 "
        "bytes, more than the limit of 16,777,216 (--max-record-bytes); raise --max-record-bytes if the data is "
        "genuine, or write the file in smaller record batches")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_a_dictionary_index_outside_its_dictionary_names_file_batch_and_column(tmp_path, run_cli, kind):
    key = pa.DictionaryArray.from_arrays(pa.array([0, 5, 1], pa.int32()), pa.array(["a", "b"]), safe=False)
    table = pa.table({"tokens": pa.array([[1], [2, 3], [4]]), "key": key})
    src = str(tmp_path / "bad.arrow")
    with (pa.ipc.new_stream if kind == "stream" else pa.ipc.new_file)(src, table.schema) as writer:
        writer.write_batch(table.to_batches()[0].slice(0, 1))
        writer.write_batch(table.to_batches()[0])
    result = run_cli("segment", src, tmp_path / "out", "--key", "key", "--sequence", "tokens", "--num-unroll", "2",
                     "--batch-size", "2")
    assert one_line(result.stderr) == (
        f"error: {src}, record batch 1, column 'key': corrupt (Dictionary indices invalid: Invalid: Value at "
        "position 1 out of bounds: 5 (should be in [0, 1]))")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("stream", [False, True])
def test_a_buffer_outside_its_batch_body_names_the_file_and_the_record_batch(tmp_path, run_cli, stream):
    table = pa.table({"tokens": pa.array([[i, i] for i in range(30)])})
    sink = io.BytesIO()
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=10)
    data = bytearray(sink.getvalue())
    layout = (ipc_meta.stream_layout if stream else ipc_meta.file_layout)(lambda at, n: bytes(data[at:at + n]),
                                                                          len(data))
    first, second = layout.batches[:2]
    offset, length = second.buffers[-1]
    at = data.index(struct.pack("<qq", offset, length), first.start + first.body)  # in batch 1's metadata
    data[at:at + 8] = struct.pack("<q", offset + 10_000)
    src = tmp_path / "outside.arrow"
    src.write_bytes(bytes(data))
    result = run_cli("convert", src, tmp_path / "out")
    assert one_line(result.stderr) == (f"error: {src}, record batch 1: corrupt Arrow IPC {'stream' if stream else 'file'}"
                                       f" (a buffer lies outside its {second.body}-byte body)")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.text(max_size=40), min_size=1, max_size=8), data=st.data())
def test_decoded_bytes_counts_what_the_decoded_column_holds(entries, data):
    """What decoded_bytes counts from the indices is what the decoded column holds (values and offsets; a null's
    offset aside), for a dictionary at the top, in a list and in a struct, sliced anywhere."""
    rows = data.draw(st.lists(st.one_of(st.none(), st.integers(0, len(entries) - 1)), min_size=1, max_size=30))
    dictionary = pa.DictionaryArray.from_arrays(pa.array(rows, pa.int32()), pa.array(entries))
    start = data.draw(st.integers(0, len(rows) - 1))
    nested = {"top": dictionary,
              "list": pa.ListArray.from_arrays(pa.array(range(0, len(rows) + 1), pa.int32()), dictionary),
              "struct": pa.StructArray.from_arrays([dictionary], ["s"])}
    for name, array in nested.items():
        array = array.slice(start)
        plain = array.cast(column_types.reading_schema(pa.schema([("c", array.type)])).field("c").type)
        nulls = sum(r is None for r in rows[start:])
        assert column_types.decoded_bytes(array) == column_types.decoded_bytes(plain) - 4 * nulls, name
