"""batchtool bucket end to end: summary, inspect's bucket table, identical bytes for any --threads, errors."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest

from batchtool.core.synthetic import make_table
from conftest import data_bytes, read_dir, write_parquet_shards


def test_auto_buckets_prints_boundaries_and_inspect_shows_the_bucket_table(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "out"
    result = run_cli("bucket", parquet_src, dst, "--auto-buckets", "4", "--batch-size", "8", "--mask")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((dst / ".batchtool_manifest.json").read_text())
    stats = manifest["stats"]
    boundaries = ",".join(map(str, stats["boundaries"]))
    assert f"auto-buckets: boundaries {boundaries}; expected padding efficiency" in result.stderr
    assert "wrote 300 rows in" in result.stderr and "padding efficiency" in result.stderr
    assert manifest["options"]["auto_buckets"] == 4 and manifest["seed"] == 0
    shown = run_cli("inspect", dst)
    assert shown.exit_code == 0
    assert "buckets (padding efficiency = real / padded elements)" in shown.output
    assert f"[0, {stats['boundaries'][0]})" in shown.output and "auto-buckets 4: expected efficiency" in shown.output
    out = read_dir(str(dst))
    assert out.schema.names[-4:] == ["batch", "bucket", "length", "mask"]


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_threads_1_and_4_give_identical_bytes(tmp_path, parquet_src, run_cli, to):
    args = ["--boundaries", "20,40", "--max-tokens", "400", "--drop-oversize", "--memory", "40KB", "--to", to, "-q"]
    for threads in (1, 4):
        assert run_cli("bucket", parquet_src, tmp_path / f"t{threads}", *args, "--threads", threads).exit_code == 0
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t4"))


def test_tfrecord_output_reads_back_as_the_same_batches(tmp_path, parquet_src, run_cli):
    args = ["--boundaries", "30", "--batch-size", "16,4", "--pad-value", "tokens=-1", "-q"]
    assert run_cli("bucket", parquet_src, tmp_path / "pq", *args).exit_code == 0
    assert run_cli("bucket", parquet_src, tmp_path / "tf", *args, "--to", "tfrecord").exit_code == 0
    assert run_cli("convert", tmp_path / "tf", tmp_path / "back", "-q").exit_code == 0
    assert read_dir(str(tmp_path / "back")).equals(read_dir(str(tmp_path / "pq")))


def test_tfrecord_input_gives_the_same_sorted_batches(tmp_path, parquet_src, run_cli):
    """Example ids differ (one TFRecord shard, two Parquet shards), so compare the seed-free sorted order."""
    assert run_cli("convert", parquet_src, tmp_path / "tfr", "--to", "tfrecord", "-q").exit_code == 0
    args = ["--auto-buckets", "3", "--batch-size", "10", "--order", "sorted", "-q"]
    assert run_cli("bucket", tmp_path / "tfr", tmp_path / "a", *args).exit_code == 0
    assert run_cli("bucket", parquet_src, tmp_path / "b", *args).exit_code == 0
    a, b = read_dir(str(tmp_path / "a")), read_dir(str(tmp_path / "b"))
    assert a.column("key").to_pylist() == b.column("key").to_pylist()
    assert a.column("tokens").to_pylist() == b.column("tokens").to_pylist()


@pytest.fixture
def odd_src(tmp_path) -> str:
    """A corpus with a column that disagrees with tokens in row 5 of the second shard."""
    t = make_table(60, seed=2)
    other = [list(range(len(x))) for x in t.column("tokens").to_pylist()]
    other[35] = other[35] + [1]
    t = t.append_column("other", pa.array(other)).append_column("flag", pa.array(np.arange(60) % 3, pa.int64()))
    return write_parquet_shards(str(tmp_path / "odd"), t, shards=2, row_group_size=10)


@pytest.mark.parametrize("args, message", [
    (["--boundaries", "10,5", "--batch-size", "4"], "--boundaries 10,5: boundaries must be strictly increasing"),
    (["--boundaries", ",", "--batch-size", "4"], "--boundaries is empty"),
    (["--boundaries", "a", "--batch-size", "4"], "--boundaries 'a': expected comma-separated integers"),
    (["--boundaries", "10", "--batch-size", "4", "--max-tokens", "9"], "exactly one of --batch-size and --max-tokens"),
    (["--boundaries", "10", "--batch-size", "4,4,4"], "3 sizes for 2 buckets"),
    (["--auto-buckets", "0", "--batch-size", "4"], "--auto-buckets 0: must be at least 1"),
    (["--auto-buckets", "2", "--batch-size", "4", "--length", "nope"], "--length nope: no such column"),
    (["--auto-buckets", "2", "--batch-size", "4", "--keep", "label"],
     "--keep label: column is int64, expected a boolean"),
    (["--auto-buckets", "2", "--batch-size", "4", "--pad-value", "label=1"], "column 'label' is not padded"),
    (["--auto-buckets", "2", "--batch-size", "4", "--sequence", "tokens", "--sequence", "other"],
     r"part-00001.parquet, row 5: sequence columns disagree in length: 'tokens' has \d+ steps, 'other' has"),
    (["--auto-buckets", "2", "--batch-size", "4"], "row 5: sequence columns disagree .*; pass --sequence"),
    (["--bucket-column", "flag", "--num-buckets", "2", "--batch-size", "4", "--sequence", "tokens"],
     r"part-00000.parquet, row 2, column 'flag': bucket 2 is outside \[0, 2\)"),
    (["--boundaries", "10", "--max-tokens", "5", "--sequence", "tokens"],
     r"part-00000.parquet, row \d+: an example of length \d+ padded to \d+ steps exceeds --max-tokens 5"),
])
def test_errors_exit_2_with_one_line_and_leave_dst_untouched(tmp_path, odd_src, run_cli, args, message):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("old")
    result = run_cli("bucket", odd_src, dst, *args, "--overwrite", "-q")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert re.search(message, result.stderr), result.stderr
    assert os.listdir(dst) == ["keep.txt"]
    assert not [d for d in os.listdir(tmp_path) if d.startswith(".dst.tmp")]


def test_existing_dst_without_overwrite(tmp_path, parquet_src, run_cli):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("not empty")
    result = run_cli("bucket", parquet_src, tmp_path / "dst", "--boundaries", "9", "--batch-size", "4")
    assert result.exit_code == 2 and "destination exists" in result.stderr


@pytest.fixture
def with_length(tmp_path, corpus) -> pa.Table:
    """The corpus with an integer `length` column holding each example's true length (as TensorFlow data has)."""
    return corpus.append_column("length", pa.array([len(x) for x in corpus.column("tokens").to_pylist()], pa.int64()))


def test_an_input_length_column_that_holds_the_lengths_is_written_once(tmp_path, parquet_src, with_length, run_cli):
    src = write_parquet_shards(str(tmp_path / "with"), with_length)
    args = ["--auto-buckets", "3", "--batch-size", "8", "--mask", "-q"]
    assert run_cli("bucket", src, tmp_path / "a", *args).exit_code == 0
    assert run_cli("bucket", parquet_src, tmp_path / "b", *args).exit_code == 0
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))  # the same bytes, one `length`


def test_a_different_length_column_names_the_row_and_output_column_renames_ours(tmp_path, with_length, run_cli):
    lengths = with_length.column("length").to_numpy().copy()
    lengths[7] += 1
    src = write_parquet_shards(str(tmp_path / "off"), with_length.set_column(
        with_length.schema.get_field_index("length"), "length", pa.array(lengths)), shards=1)
    result = run_cli("bucket", src, tmp_path / "a", "--auto-buckets", "3", "--batch-size", "8")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and not (tmp_path / "a").exists()
    assert re.search(r"part-00000.parquet, row 7, column 'length': \d+ but its length is \d+; bucket writes its own "
                     r"'length' column and takes yours only when it holds that on every row: name bucket's otherwise "
                     r"with --output-column length=NEW_NAME", result.stderr)
    ok = run_cli("bucket", src, tmp_path / "b", "--auto-buckets", "3", "--batch-size", "8", "--mask",
                 "--output-column", "length=steps,mask=real", "-q")
    assert ok.exit_code == 0, ok.stderr
    out = read_dir(str(tmp_path / "b"))
    assert out.schema.names[-5:] == ["length", "batch", "bucket", "steps", "real"]
    true = [len(x) for x in with_length.column("tokens").to_pylist()]
    keys = [int(k[3:]) for k in out.column("key").to_pylist()]
    assert out.column("steps").to_pylist() == [true[k] for k in keys]
    assert out.column("length").to_pylist() == [int(lengths[k]) for k in keys]  # the user's column, untouched


@pytest.mark.parametrize("column, args, message", [
    ("batch", [], "column 'batch' is also an output column of bucket; name bucket's otherwise with --output-column "
                  "batch=NEW_NAME"),
    ("bucket", ["--output-column", "bucket=bucket"], "--output-column bucket=NEW_NAME"),
    ("x", ["--output-column", "lane=b"], "--output-column lane=b: expected OUT=NAME with OUT one of batch, bucket, "
                                         "length, mask"),
    ("x", ["--output-column", "length=bucket"], "two output columns would be named 'bucket'"),
    ("x", ["--output-column", "length"], "--output-column 'length': expected OUT=NAME"),
])
def test_output_column_clashes_are_one_line_errors(tmp_path, corpus, run_cli, column, args, message):
    src = write_parquet_shards(str(tmp_path / "src"), corpus.append_column(column, pa.array(["v"] * corpus.num_rows)))
    result = run_cli("bucket", src, tmp_path / "dst", "--auto-buckets", "3", "--batch-size", "8", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
