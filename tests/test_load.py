"""batchtool.load: batches of any batch-shard output as NumPy arrays, zero-copy where Arrow allows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_parquet_shards

import batchtool
from batchtool.convert import convert
from batchtool.errors import InputError, SchemaError
from batchtool.job import RunSettings
from batchtool.load import column_to_numpy
from batchtool.ops.segment import SegmentOptions, segment
from batchtool.output import BatchShardWriter, EncodedBatch, OutputOptions
from batchtool.synthetic import make_table

QUIET = RunSettings(threads=2, quiet=True)
OPTIONS = SegmentOptions(key="key", sequences=("tokens", "frames"), num_unroll=5, batch_size=4,
                         context=("label", "weight"))


@pytest.fixture
def segmented(tmp_path) -> str:
    src = write_parquet_shards(str(tmp_path / "src"), make_table(80, seed=4))
    segment(src, str(tmp_path / "seg"), OPTIONS, OutputOptions(shard_rows=60), run=QUIET)
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


def test_numeric_arrays_are_views_of_arrow_buffers(segmented):
    batch = next(iter(batchtool.load(segmented)))
    for name in ("tokens", "frames", "length", "weight"):
        assert not batch[name].flags.writeable, name  # a read-only view of Arrow memory, not a copy
        assert batch[name].base is not None


def test_columns_projection(segmented):
    loader = batchtool.load(segmented, columns=["frames", "sequence"])
    batch = next(iter(loader))
    assert list(batch) == ["frames", "sequence"]
    with pytest.raises(SchemaError, match="no column 'nope'"):
        batchtool.load(segmented, columns=["nope"])


def test_shuffle_files_is_a_seeded_permutation_of_files(segmented):
    plain = [int(b["batch"][0]) for b in batchtool.load(segmented)]
    a = [int(b["batch"][0]) for b in batchtool.load(segmented, shuffle_files=True, seed=3)]
    b = [int(b["batch"][0]) for b in batchtool.load(segmented, shuffle_files=True, seed=3)]
    assert a == b and sorted(a) == plain
    orders = {tuple(int(x["batch"][0]) for x in batchtool.load(segmented, shuffle_files=True, seed=s))
              for s in range(8)}
    assert len(orders) > 1


def test_ragged_lists_become_object_arrays():
    arr = pa.array([[1, 2], [3], None], pa.list_(pa.int64()))
    out = column_to_numpy(arr)
    assert out.dtype == object and out[0].tolist() == [1, 2] and out[1].tolist() == [3] and out[2] is None
    nested = pa.array([[[1.0, 2.0]], [[3.0, 4.0]]], pa.list_(pa.list_(pa.float64(), 2)))
    assert column_to_numpy(nested).shape == (2, 1, 2)
    sliced = column_to_numpy(pa.array([[9, 9], [1, 2], [3, 4]], pa.list_(pa.int64())).slice(1))
    assert sliced.tolist() == [[1, 2], [3, 4]]


def test_any_batch_shard_output_reads_one_batch_per_row_group(tmp_path):
    """A bucket-style output: batches of different padded lengths and sizes."""
    os.makedirs(tmp_path / "out")
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("label", pa.int64())])
    writer = BatchShardWriter(str(tmp_path / "out"), schema, OutputOptions())
    sizes = [(3, 2), (2, 7), (1, 4)]
    for rows, length in sizes:
        batch = pa.RecordBatch.from_pydict({"tokens": [[i] * length for i in range(rows)],
                                            "label": list(range(rows))}, schema=schema)
        writer.write(EncodedBatch(batch))
    writer.close()
    loader = batchtool.load(str(tmp_path / "out"))
    assert len(loader) == 3
    assert [b["tokens"].shape for b in loader] == sizes


def test_tfrecord_output_without_a_batch_column_is_refused(tmp_path):
    src = write_parquet_shards(str(tmp_path / "src"), make_table(10, seed=1))
    convert(src, str(tmp_path / "tf"), OutputOptions(format="tfrecord"), run=QUIET)
    with pytest.raises(SchemaError, match="no 'batch' column"):
        batchtool.load(str(tmp_path / "tf"))


def test_a_file_the_manifest_lists_must_exist(segmented):
    os.remove(os.path.join(segmented, "part-00001.parquet"))
    with pytest.raises(InputError, match=r"part-00001.parquet: listed in .*\.batchtool_manifest\.json but missing"):
        batchtool.load(segmented)
