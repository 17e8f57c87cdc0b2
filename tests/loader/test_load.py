"""batchtool.load: batches of any batch-shard output as NumPy arrays, zero-copy where Arrow allows."""

from __future__ import annotations

import importlib
import json
import re
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_parquet_shards
from load_outputs import bucket_output, manifest_file

import batchtool
from batchtool.exec.convert import convert
from batchtool.core.errors import InputError, SchemaError
from batchtool.core.run_settings import RunSettings
from batchtool.loader.load import column_to_numpy
from batchtool.exec.driver import run_operation
from batchtool.ops.segment import OP as SEGMENT
from batchtool.ops.segment import SegmentOptions
from batchtool.io.output import BatchShardWriter, EncodedBatch, OutputOptions
from batchtool.core.synthetic import make_table

QUIET = RunSettings(threads=2, quiet=True)
OPTIONS = SegmentOptions(key="key", sequence=("tokens", "frames"), num_unroll=5, batch_size=4,
                         context=("label", "weight"))


@pytest.fixture
def segmented(tmp_path) -> str:
    src = write_parquet_shards(str(tmp_path / "src"), make_table(80, seed=4))
    run_operation(SEGMENT, OPTIONS, src, str(tmp_path / "seg"), OutputOptions(shard_rows=60), QUIET)
    return str(tmp_path / "seg")


def test_batches_are_shaped_batch_time_features(segmented):
    loader = batchtool.load(segmented)
    batches = list(loader)
    assert len(loader) == len(batches) == sum(
        pq.ParquetFile(os.path.join(segmented, f)).metadata.num_row_groups
        for f in sorted(os.listdir(segmented)) if f.endswith(".parquet"))
    assert len([f for f in os.listdir(segmented) if f.endswith(".parquet")]) > 1
    first = batches[0]
    assert first["tokens"].shape == (4, 5) and first["tokens"].dtype == np.int64
    assert first["frames"].shape == (4, 5, 3) and first["frames"].dtype == np.float32
    assert first["label"].shape == (4,) and first["weight"].dtype == np.float32
    assert first["key"].dtype == object and isinstance(first["key"][0], str)
    assert [int(b["batch"][0]) for b in batches] == list(range(len(batches)))


def test_numeric_arrays_are_writable_views_of_the_decoded_buffers(segmented):
    first, second = list(batchtool.load(segmented))[:2]
    for name in ("tokens", "frames", "length", "weight"):
        assert first[name].flags.writeable and not first[name].flags.owndata, name  # a view, not a copy
        assert first[name].base is not None
    before = second["tokens"].copy()
    first["tokens"][:] = -1  # writing into one batch leaves the others alone
    np.testing.assert_array_equal(second["tokens"], before)
    readonly = next(iter(batchtool.load(segmented, writable=False)))
    assert not readonly["frames"].flags.writeable and readonly["frames"].base is not None


def test_columns_projection(segmented):
    loader = batchtool.load(segmented, columns=["frames", "sequence"])
    batch = next(iter(loader))
    assert list(batch) == ["frames", "sequence"]
    with pytest.raises(SchemaError, match="no column 'nope'"):
        batchtool.load(segmented, columns=["nope"])


def test_metadata_from_the_manifest_and_footers(segmented, tmp_path):
    loader = batchtool.load(segmented)
    assert loader.num_lanes == loader.batch_size == 4
    assert loader.manifest["command"] == "segment" and loader.num_batches == loader.manifest["output"]["batches"]
    bucketed = batchtool.load(bucket_output(str(tmp_path)))
    assert bucketed.num_lanes is None and bucketed.batch_size == 11
    index = bucketed.batch_index()
    assert index["batch"].tolist() == bucketed.epoch_batches().tolist()
    batches = {int(b["batch"][0]): b for b in bucketed}
    assert len(set(index["bucket"].tolist())) == 3
    for batch, rows, bucket in zip(index["batch"], index["rows"], index["bucket"]):
        assert rows == len(batches[batch]["label"]) and (batches[batch]["bucket"] == bucket).all()
    tf = batchtool.load(bucket_output(str(tmp_path), "tfrecord"), shuffle=False)
    assert tf.batch_index()["rows"].tolist() == [len(b["label"]) for b in tf] and "bucket" not in tf.batch_index()


def test_ragged_lists_become_object_arrays():
    arr = pa.array([[1, 2], [3], None], pa.list_(pa.int64()))
    out = column_to_numpy(arr)
    assert out.dtype == object and out[0].tolist() == [1, 2] and out[1].tolist() == [3] and out[2] is None
    nested = pa.array([[[1.0, 2.0]], [[3.0, 4.0]]], pa.list_(pa.list_(pa.float64(), 2)))
    assert column_to_numpy(nested).shape == (2, 1, 2)
    sliced = column_to_numpy(pa.array([[9, 9], [1, 2], [3, 4]], pa.list_(pa.int64())).slice(1))
    assert sliced.tolist() == [[1, 2], [3, 4]]
    writable = column_to_numpy(pa.array([[9, 9], [1, 2], [3, 4]], pa.list_(pa.int64())).slice(1), writable=True)
    assert writable.tolist() == [[1, 2], [3, 4]] and writable.flags.writeable


def test_any_batch_shard_output_reads_one_batch_per_row_group(tmp_path):
    """A bucket-style output without a manifest: batches of different padded lengths and sizes."""
    os.makedirs(tmp_path / "out")
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("label", pa.int64())])
    writer = BatchShardWriter(str(tmp_path / "out"), schema, OutputOptions())
    sizes = [(3, 2), (2, 7), (1, 4)]
    for rows, length in sizes:
        batch = pa.RecordBatch.from_pydict({"tokens": [[i] * length for i in range(rows)],
                                            "label": list(range(rows))}, schema=schema)
        writer.write(EncodedBatch(batch))
    writer.close()
    loader = batchtool.load(str(tmp_path / "out"), shuffle=False)
    assert len(loader) == 3
    assert [b["tokens"].shape for b in loader] == sizes
    assert sorted(b["tokens"].shape for b in batchtool.load(str(tmp_path / "out"))) == sorted(sizes)


def test_tfrecord_batches_come_from_the_batch_index_not_a_column(tmp_path):
    """convert writes one batch per input chunk and no `batch` column: the manifest's index still finds them."""
    src = write_parquet_shards(str(tmp_path / "src"), make_table(90, seed=1), row_group_size=20)
    convert(src, str(tmp_path / "pq"), OutputOptions(), run=QUIET)
    convert(src, str(tmp_path / "tf"), OutputOptions(format="tfrecord", shard_rows=50), run=QUIET)
    a = list(batchtool.load(str(tmp_path / "pq"), shuffle=False).record_batches())
    b = list(batchtool.load(str(tmp_path / "tf"), shuffle=False).record_batches())
    assert [x.num_rows for x in b] == [20, 20, 5, 20, 20, 5] == [x.num_rows for x in a]
    assert [x.to_pylist() for x in a] == [x.to_pylist() for x in b]


def tfrecord_manifest(tmp_path) -> str:
    src = write_parquet_shards(str(tmp_path / "src"), make_table(10, seed=1))
    convert(src, str(tmp_path / "tf"), OutputOptions(format="tfrecord"), run=QUIET)
    return manifest_file(str(tmp_path / "tf"))


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_tfrecord_output_of_batchtool_0_1_is_indexed_from_its_batch_column(tmp_path, compression):
    """0.1 wrote `manifest.json` and no batch index: the batches are found where the `batch` column changes,
    the same batches, shuffled and resumed as for today's output."""
    new = bucket_output(str(tmp_path), "tfrecord", compression)
    old = str(tmp_path / "old")
    shutil.copytree(new, old)
    manifest = json.load(open(manifest_file(old)))
    for entry in manifest["output"]["files"]:
        del entry["batch_index"]
    os.remove(manifest_file(old))
    json.dump(manifest, open(os.path.join(old, "manifest.json"), "w"))
    for shuffle in (False, True) if compression is None else (False,):
        expected = [b.to_pylist() for b in batchtool.load(new, shuffle=shuffle, seed=3).record_batches()]
        loader = batchtool.load(old, shuffle=shuffle, seed=3)
        assert [b.to_pylist() for b in loader.record_batches()] == expected
        resumed = batchtool.load(old, shuffle=shuffle, seed=3)
        resumed.load_state_dict({**loader.state_dict(), "position": 7})
        assert [b.to_pylist() for b in resumed.record_batches()] == expected[7:]


def test_an_old_tfrecord_output_whose_batch_column_disagrees_is_an_input_error(tmp_path):
    path = tfrecord_manifest(tmp_path)
    manifest = json.load(open(path))
    del manifest["output"]["files"][0]["batch_index"]
    json.dump(manifest, open(path, "w"))
    with pytest.raises(InputError, match=r"part-00000.tfrecord: no batch index in \S*manifest\.json and no 'batch' "
                                         r"column"):
        batchtool.load(str(tmp_path / "tf"))


def test_a_batch_index_that_disagrees_with_the_manifest_is_an_input_error(tmp_path):
    path = tfrecord_manifest(tmp_path)
    manifest = json.load(open(path))
    manifest["output"]["files"][0]["batches"] += 1
    json.dump(manifest, open(path, "w"))
    with pytest.raises(InputError, match=r"part-00000.tfrecord: unreadable batch index in \S*manifest\.json \(holds 2 "
                                         r"batches, not 3\)"):
        batchtool.load(str(tmp_path / "tf"))


def test_a_parquet_file_that_disagrees_with_the_manifest_is_an_input_error(segmented):
    path = manifest_file(segmented)
    manifest = json.load(open(path))
    groups = manifest["output"]["files"][0]["batches"]
    manifest["output"]["files"][0]["batches"] -= 1
    manifest["output"]["files"][1]["batches"] += 1
    json.dump(manifest, open(path, "w"))
    with pytest.raises(InputError, match=rf"part-00000.parquet: has {groups} row groups, but \S*manifest\.json lists "
                                         rf"{groups - 1} batches"):
        list(batchtool.load(segmented))


def test_a_file_the_manifest_lists_must_exist(segmented):
    os.remove(os.path.join(segmented, "part-00001.parquet"))
    with pytest.raises(InputError, match=r"part-00001.parquet: listed in .*\.batchtool_manifest\.json but missing"):
        batchtool.load(segmented)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_that_does_not_convert_ends_the_stream_after_the_batches_before_it(tmp_path, monkeypatch, threads):
    """The reading threads convert a run of batches ahead of the loop; one that fails is raised where the loop
    reaches it, after every batch before it (the position counts those)."""
    load_module = importlib.import_module("batchtool.loader.load")  # (the attribute batchtool.load is the function)
    dst = bucket_output(str(tmp_path), "arrow")
    expected = [int(b["batch"][0]) for b in batchtool.load(dst, shuffle=False)]
    bad = expected[6]
    convert = load_module.views

    def failing(batch, writable, where, unsliced):
        if batch.column("batch")[0].as_py() == bad:
            raise InputError(f"{where()}: cannot convert")
        return convert(batch, writable, where, unsliced)

    monkeypatch.setattr(load_module, "views", failing)
    loader = batchtool.load(dst, shuffle=False, threads=threads)
    got = []
    with pytest.raises(InputError, match=r"part-\d+\.arrow, batch \d+: cannot convert"):
        for batch in loader:
            got.append(int(batch["batch"][0]))
    assert got == expected[:6] and loader.position == 6


@pytest.mark.parametrize("compression, verify, large, inline", [("none", False, False, True),
                                                                ("none", True, False, True),
                                                                ("none", True, True, False),
                                                                ("none", False, True, True),
                                                                ("zstd", False, False, False)])
def test_views_of_a_memory_map_are_made_on_the_consuming_thread(tmp_path, monkeypatch, compression, verify, large,
                                                                 inline):
    """Uncompressed Arrow IPC batches are views of the map (nothing to decode): the loop reads and converts them
    itself, with no reading thread, whatever `threads` says, and verifies their CRC32Cs itself where they average at
    most INLINE_VERIFIED_BYTES (`large`: as if every batch were more); a read that decompresses, or verifies large
    batches, goes to the reading threads. The batches are the same either way."""
    import threading

    from batchtool.io.formats import arrow

    if large:
        monkeypatch.setattr(arrow, "INLINE_VERIFIED_BYTES", 0)
    load_module = importlib.import_module("batchtool.loader.load")
    dst = bucket_output(str(tmp_path), "arrow", compression)
    convert = load_module.views
    threads_seen = set()

    def recording(batch, writable, where, unsliced):
        threads_seen.add(threading.current_thread() is threading.main_thread())
        return convert(batch, writable, where, unsliced)

    monkeypatch.setattr(load_module, "views", recording)
    got = [b["batch"][0] for b in batchtool.load(dst, threads=2, seed=3, verify=verify)]
    assert threads_seen == {inline}
    monkeypatch.setattr(load_module, "views", convert)
    assert got == [b["batch"][0] for b in batchtool.load(dst, threads=1, seed=3)]


def every_kind_output(root: str) -> str:
    """An Arrow IPC output with a column of every kind of the Arrays table, in batches that take each path of the
    conversion: null-free number columns (made from the batch's buffers; a ragged list still per column), a number
    column with a null (the whole batch per column), a null list row."""
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("frames", pa.list_(pa.list_(pa.float32(), 2))),
                        ("label", pa.int64()), ("score", pa.float64()), ("flag", pa.bool_()), ("key", pa.string()),
                        ("blob", pa.binary()), ("context", pa.list_(pa.int32()))])
    rows = [
        {"tokens": [[1, 2, 3], [4, 5, 6]], "frames": [[[1, 2]], [[3, 4]]], "label": [7, 8], "score": [0.5, 1.5],
         "flag": [True, False], "key": ["a", "bé"], "blob": [b"\x00", b""], "context": [[1], [2, 3]]},
        {"tokens": [[9], [8], [7]], "frames": [[[5, 6]] * 2] * 3, "label": [1, 2, 3], "score": [None, 2.0, 3.0],
         "flag": [True, None, False], "key": ["x", None, "z"], "blob": [b"q", b"r", None], "context": [[4], [5], [6]]},
        {"tokens": [[1, 1], None], "frames": [[[7, 8]], [[9, 10]]], "label": [4, 5], "score": [4.0, 5.0],
         "flag": [False, False], "key": ["m", "n"], "blob": [b"s", b"t"], "context": [None, []]},
    ]
    dst = os.path.join(root, "kinds")
    os.makedirs(dst)
    writer = BatchShardWriter(dst, schema, OutputOptions(format="arrow", compression="none"))
    for columns in rows:
        writer.write(EncodedBatch(pa.RecordBatch.from_pydict(columns, schema=schema)))
    writer.close()
    return dst


@pytest.mark.parametrize("kind", ["every column kind", "bucket"])
@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_arrow_batches_are_the_arrays_to_numpy_makes_of_their_record_batches(tmp_path, kind, writable, shuffle):
    """load's path for Arrow IPC (arrays from each batch's buffers; for output with a manifest, on the consuming
    thread) gives exactly the arrays of the per-column conversion, in every order, and from a resumed position."""
    from test_arrays_plan import assert_same

    from batchtool.loader.arrays import to_numpy

    root = str(tmp_path)
    dst = every_kind_output(root) if kind == "every column kind" else bucket_output(root, "arrow", "none")
    want = [to_numpy(b, writable) for b in batchtool.load(dst, shuffle=shuffle, seed=5).record_batches()]
    loader = batchtool.load(dst, shuffle=shuffle, seed=5, writable=writable)
    middle = len(want) // 2
    state = {**loader.state_dict(), "position": middle}
    resumed = batchtool.load(dst, shuffle=shuffle, seed=5, writable=writable)
    resumed.load_state_dict(state)
    for got, expected in ((list(loader), want), (list(resumed), want[middle:])):
        assert len(got) == len(expected)
        for i, (batch, arrays) in enumerate(zip(got, expected)):
            assert list(batch) == list(arrays)
            for name in arrays:
                assert_same(batch[name], arrays[name], f"batch {i}, {name}")


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "tfrecord"])
def test_checksums_are_verified_by_default_wherever_the_output_records_them(tmp_path, fmt):
    """Every batch format batchtool writes records checksums, so every default read checks them (Parquet's pages
    and TFRecord's records on every read; Arrow IPC's CRC32C unless verify=False), and the batches are the same."""
    dst = bucket_output(str(tmp_path), fmt)
    loader = batchtool.load(dst, shuffle=False)
    assert loader.verify and batchtool.source(dst).verify
    assert batchtool.load(dst, verify=False).verify is False
    unverified = list(batchtool.load(dst, shuffle=False, verify=False))
    for got, expected in zip(loader, unverified, strict=True):
        assert got.keys() == expected.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], expected[name])


def test_a_batch_is_verified_once_a_process_until_its_file_changes(tmp_path, monkeypatch):
    """Later epochs read the bytes whose CRC32C matched (the memory map holds them), so only the first verifies;
    a file written in place has new times, and its batches are verified again: the damage is one error."""
    from batchtool.io import batch_check

    dst = shutil.copytree(bucket_output(str(tmp_path / "out"), "arrow", compression="none"), str(tmp_path / "copy"))
    verified = []
    real = batch_check.verify_crc
    monkeypatch.setattr(batch_check, "verify_crc", lambda *args: verified.append(args[-1]) or real(*args))
    loader = batchtool.load(dst, shuffle=False)
    list(loader)
    assert len(verified) == len(loader) > 1
    list(loader)
    list(batchtool.load(dst, shuffle=True, seed=3))
    assert len(verified) == len(loader)
    path = os.path.join(dst, sorted(f for f in os.listdir(dst) if f.startswith("part-"))[0])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    with open(path, "r+b") as f:
        f.write(bytes(data))
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # (whatever the clock's grain)
    with pytest.raises(InputError, match=re.escape(path) + r", record batch \d+: corrupt \(CRC32C"):
        list(loader)


@pytest.mark.parametrize("fmt, named", [("tfrecord", r"batch \d+, record \d+: data CRC mismatch"),
                                        ("parquet", r"row group \d+, column '\w+': corrupt \(a page checksum does "
                                                    r"not match"),
                                        ("arrow", r"record batch \d+: corrupt \(CRC32C")])
def test_a_changed_value_is_one_error_naming_the_file_and_the_batch(tmp_path, fmt, named):
    """A flipped bit in the middle of a shard's data (a value, for every format here): by default every format's
    checksum catches it, one InputError naming the file and its batch (a Parquet batch is a row group)."""
    dst = shutil.copytree(bucket_output(str(tmp_path / "out"), fmt, compression="none"), str(tmp_path / "copy"))
    path = os.path.join(dst, sorted(f for f in os.listdir(dst) if f.startswith("part-"))[0])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(InputError, match=re.escape(path) + ", " + named):
        list(batchtool.load(dst, shuffle=False))
