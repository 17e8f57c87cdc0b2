"""Batch-shard output: all-or-nothing directories, row groups per batch, rollover, checksums."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchtool.core.errors import DestinationError, DestinationExistsError
from batchtool.io.output import BatchShardWriter, OutputOptions, encode_batches, output_directory


def small_batches(n: int, rows: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"x": pa.array(range(i * rows, (i + 1) * rows))}) for i in range(n)]


def test_one_row_group_per_batch_and_rollover_by_rows(tmp_path):
    writer = BatchShardWriter(str(tmp_path), pa.schema([("x", pa.int64())]), OutputOptions(shard_rows=25))
    for b in small_batches(6, 10):
        writer.write(next(encode_batches([b], writer.options)))
    files = writer.close()
    assert [f["path"] for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    assert [f["rows"] for f in files] == [30, 30]
    meta = pq.ParquetFile(tmp_path / "part-00000.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [10, 10, 10]
    for f in files:
        data = (tmp_path / f["path"]).read_bytes()
        assert f["bytes"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest()


def test_empty_output_still_has_a_shard_with_the_schema(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    files = BatchShardWriter(str(tmp_path), schema, OutputOptions()).close()
    assert files[0]["rows"] == 0
    assert pq.read_table(tmp_path / files[0]["path"]).schema.equals(schema)


def test_failed_block_leaves_dst_untouched_and_no_temp_dir(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with output_directory(str(dst), overwrite=True) as tmp:
            open(os.path.join(tmp, "part-00000.parquet"), "w").write("half")
            raise RuntimeError("boom")
    assert (dst / "keep.txt").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_interrupt_leaves_no_dst(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with output_directory(str(dst), overwrite=False):
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_existing_dst_needs_overwrite(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old").write_text("kept")
    with pytest.raises(DestinationExistsError, match="pass --overwrite"):
        with output_directory(str(dst), overwrite=False):
            pass
    with output_directory(str(dst), overwrite=True) as tmp:
        open(os.path.join(tmp, "new"), "w").write("x")
    assert os.listdir(dst) == ["new"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_gzip_tfrecord_output_is_byte_identical_across_runs(tmp_path):
    opts = OutputOptions(format="tfrecord", compression="gzip")
    outputs = []
    for run in range(2):
        d = tmp_path / str(run)
        d.mkdir()
        w = BatchShardWriter(str(d), pa.schema([("x", pa.int64())]), opts)
        for b in small_batches(3, 4):
            w.write(next(encode_batches([b], opts)))
        files = w.close()
        outputs.append((d / files[0]["path"]).read_bytes())
    assert files[0]["path"].endswith(".tfrecord.gz")
    assert outputs[0] == outputs[1]


def test_manifest_schema_round_trip():
    from batchtool.io.manifest import schema_from_json, schema_to_json

    schema = pa.schema([("a", pa.list_(pa.int16())), ("b", pa.float64())])
    assert schema_from_json(json.loads(json.dumps(schema_to_json(schema)))).equals(schema)


def test_parquet_shards_roll_over_by_batch_count(tmp_path, monkeypatch):
    from batchtool.io.formats.parquet import ParquetFormat

    monkeypatch.setattr(ParquetFormat, "max_shard_batches", 4)
    writer = BatchShardWriter(str(tmp_path), pa.schema([("x", pa.int64())]), OutputOptions())
    for b in small_batches(10, 2):
        writer.write(next(encode_batches([b], writer.options)))
    assert [f["batches"] for f in writer.close()] == [4, 4, 2]


def test_statistics_only_for_flat_columns(tmp_path):
    schema = pa.schema([("x", pa.int64()), ("seq", pa.list_(pa.int64()))])
    writer = BatchShardWriter(str(tmp_path), schema, OutputOptions())
    batch = pa.record_batch({"x": [1, 2], "seq": [[1], [2, 3]]}, schema=schema)
    writer.write(next(encode_batches([batch], writer.options)))
    meta = pq.ParquetFile(tmp_path / writer.close()[0]["path"]).metadata.row_group(0)
    assert meta.column(0).statistics.min == 1
    assert meta.column(1).statistics is None


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "tfrecord"])
def test_shards_roll_over_after_the_batch_that_reaches_shard_bytes(tmp_path, fmt):
    """Writes are buffered, but a shard still ends right after the first batch that takes it to --shard-bytes."""
    import io

    options = OutputOptions(format=fmt, shard_bytes=3000)
    schema = pa.schema([("x", pa.int64())])
    batches = list(encode_batches(small_batches(40, 37), options))
    writer = BatchShardWriter(str(tmp_path), schema, options)
    for b in batches:
        writer.write(b)
    files = writer.close()
    assert len(files) > 2
    first = 0
    for f in files:
        data = (tmp_path / f["path"]).read_bytes()
        assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
        sizes = []  # the shard's size before its footer, after each of its batches, written unbuffered
        plain = io.BytesIO()
        sink = options.spec.open_sink(plain, schema, options)
        for b in batches[first:first + f["batches"]]:
            sink.write(b)
            sizes.append(plain.tell())
        assert all(size < 3000 for size in sizes[:-1])
        if f is not files[-1]:
            assert sizes[-1] >= 3000
        first += f["batches"]
    assert first == len(batches)


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_overlapped_hashing_writes_the_same_shards(tmp_path, fmt):
    """The local writer's hashing thread (overlap) writes and hashes exactly what the writer thread would: several
    MiB per shard, so many buffers pass through its queue, and shards roll over on the way."""
    schema = pa.schema([("x", pa.float64())])
    values = np.random.default_rng(0).random(200_000)
    batches = [pa.record_batch({"x": pa.array(values + i)}) for i in range(12)]
    written = {}
    for overlap in (False, True):
        out = tmp_path / str(overlap)
        out.mkdir()
        writer = BatchShardWriter(str(out), schema, OutputOptions(format=fmt, shard_bytes=5 << 20), overlap=overlap)
        for b in batches:
            writer.write(next(encode_batches([b], writer.options)))
        written[overlap] = writer.close()
        for f in written[overlap]:
            data = (out / f["path"]).read_bytes()
            assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert len(written[True]) > 1
    assert written[True] == written[False]


def test_a_failed_write_on_the_hashing_thread_is_one_destination_error(tmp_path, monkeypatch):
    """The disk refusing a write on the overlapping thread surfaces in the writer thread as the one DestinationError
    naming DST and the shard, and the thread ends (close returns)."""
    from batchtool.io import output

    def full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.HashingFile, "_append", full)
    writer = BatchShardWriter(str(tmp_path), pa.schema([("x", pa.float64())]), OutputOptions(format="arrow"),
                              name="DST", overlap=True)
    with pytest.raises(DestinationError, match=r"DST: cannot write the output \(part-00000.arrow\).*No space"):
        for _ in range(20):
            batch = pa.record_batch({"x": pa.array([1.0] * 200_000)})
            writer.write(next(encode_batches([batch], writer.options)))
        writer.close()


def test_a_block_that_fails_ends_the_hashing_thread(tmp_path):
    """A run that fails mid-shard (a worker's error, Ctrl-C) leaves no hashing thread or open file behind."""
    import threading

    with pytest.raises(KeyboardInterrupt):
        with BatchShardWriter(str(tmp_path), pa.schema([("x", pa.float64())]), OutputOptions(format="arrow"),
                              overlap=True) as writer:
            batch = pa.record_batch({"x": pa.array([1.0] * 400_000)})
            writer.write(next(encode_batches([batch], writer.options)))
            assert any(t.name == "batchtool-hash" for t in threading.enumerate())
            raise KeyboardInterrupt
    assert not any(t.name == "batchtool-hash" for t in threading.enumerate())


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "tfrecord"])
def test_batches_encoded_together_are_the_bytes_of_each_encoded_alone(fmt):
    """encode_batches groups small batches into one encode call (TFRecord's codec costs per call): each batch's
    bytes are still those of encoding it alone, an empty batch included."""
    schema = pa.schema([("key", pa.string()), ("seq", pa.list_(pa.int64())), ("w", pa.float32())])
    rows = [3, 0, 1, 5, 2]
    batches, start = [], 0
    for n in rows:
        batches.append(pa.record_batch({"key": [f"k{start + i}" for i in range(n)],
                                        "seq": [list(range(start + i)) for i in range(n)],
                                        "w": [float(i) for i in range(n)]}, schema=schema))
        start += n
    options = OutputOptions(format=fmt)
    together = list(encode_batches(batches, options))
    alone = [options.spec.encode(b, options) for b in batches]
    assert [e.data.num_rows for e in together] == rows
    assert [e.framed for e in together] == [e.framed for e in alone]
    assert all(t.data.equals(a.data) for t, a in zip(together, alone))
