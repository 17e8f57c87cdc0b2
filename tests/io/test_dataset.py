"""Opening SRC: files, directories, globs; projection; stable ids; one-line errors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchtool.core import rng
from batchtool.core.errors import InputError, SchemaError
from batchtool.io.formats.example import encode_records
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter
from batchtool.io.inputs import open_dataset
from batchtool.core.synthetic import make_table
from batchtool.core.runner import Threads
from conftest import write_parquet_shards


def collect(dataset, columns=None, threads=1):
    chunks = list(dataset.chunks(columns, Threads(threads)))
    return pa.Table.from_batches([c.data for c in chunks]), np.concatenate([c.ids for c in chunks])


def test_directory_file_and_glob_give_the_same_rows(parquet_src, corpus):
    whole, _ = collect(open_dataset(parquet_src))
    assert whole.equals(corpus)
    globbed, _ = collect(open_dataset(os.path.join(parquet_src, "part-*.parquet")))
    assert globbed.equals(corpus)
    first, _ = collect(open_dataset(os.path.join(parquet_src, "part-00000.parquet")))
    assert first.equals(corpus.slice(0, 150))


def test_projection_reads_only_the_asked_columns(parquet_src, corpus):
    table, _ = collect(open_dataset(parquet_src), ["label", "key"])
    assert table.column_names == ["label", "key"]
    assert table.column("key").equals(corpus.column("key"))


def test_ids_are_shard_and_row(parquet_src):
    _, ids = collect(open_dataset(parquet_src), ["label"], threads=4)
    expected = np.concatenate([rng.example_ids(0, 0, 150), rng.example_ids(1, 0, 150)])
    assert np.array_equal(ids, expected)


def test_row_count_from_metadata(parquet_src):
    assert open_dataset(parquet_src).num_rows == 300


@pytest.mark.parametrize("make, message", [
    (lambda d: os.path.join(d, "missing"), "no such file or directory"),
    (lambda d: (os.makedirs(os.path.join(d, "empty")), os.path.join(d, "empty"))[1], "empty input"),
    (lambda d: (open(os.path.join(d, "x.csv"), "w").close(), os.path.join(d, "x.csv"))[1], "unknown format"),
    (lambda d: (open(os.path.join(d, "z.parquet"), "w").close(), os.path.join(d, "z.parquet"))[1], "0 bytes"),
    (lambda d: (open(os.path.join(d, "bad.parquet"), "wb").write(b"PAR1 not really"),
                os.path.join(d, "bad.parquet"))[1], "not a readable Parquet file"),
    (lambda d: os.path.join(d, "nothing-*.parquet"), "no files match"),
])
def test_unreadable_inputs_raise_one_line_input_errors(tmp_path, make, message):
    path = make(str(tmp_path))
    with pytest.raises(InputError, match=message) as info:
        open_dataset(path)
    assert "\n" not in str(info.value)


def test_missing_column_lists_available(parquet_src):
    with pytest.raises(SchemaError, match=r"no column 'nope' \(available: key, label, weight, tokens, frames\)"):
        list(open_dataset(parquet_src).chunks(["nope"]))


def test_shards_with_different_schemas_are_refused(tmp_path, corpus):
    d = tmp_path / "mixed"
    write_parquet_shards(str(d), corpus, shards=1)
    pq.write_table(corpus.drop_columns(["weight"]), str(d / "part-00001.parquet"))
    with pytest.raises(SchemaError, match="part-00001.parquet: schema differs.*'weight' missing"):
        open_dataset(str(d))


def test_tfrecord_read_tasks_carry_offsets_not_records(tmp_path):
    """What a task needs to read its records where it runs: a path and a byte range, a few hundred bytes pickled
    (so on a cluster the records never leave the worker that reads them); the chunks and ids are the file's."""
    table = make_table(2500, seed=2)
    path = str(tmp_path / "part.tfrecord")
    with TFRecordFileWriter(path) as writer:
        writer.write_many(encode_records(table.to_batches()[0]))
    dataset = open_dataset(path)
    tasks = list(dataset.tasks())
    assert len(tasks) == 3  # 1,024 records each
    assert max(len(pickle.dumps(task)) for task in tasks) < 4096 < os.path.getsize(path) // 100
    chunks = [task() for task in tasks]
    assert sum(c.num_rows for c in chunks) == 2500
    assert np.array_equal(np.concatenate([c.ids for c in chunks]), rng.example_ids(0, 0, 2500))
