"""A value batchtool cannot take names the file and the row in that file, not the row within a chunk or a batch."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dirstate import listing, snapshot


@pytest.fixture
def src(tmp_path) -> str:
    """Two files; the second's row 242 (in its third row group of 100) holds a null inside `tokens`, a uint64
    beyond int64 and a negative length."""
    rows = 300
    tokens = [[i, i + 1] for i in range(rows)]
    tokens[242] = [1, None]
    big = [i for i in range(rows)]
    big[242] = 1 << 63
    table = pa.table({"key": [f"k{i}" for i in range(rows)], "tokens": tokens, "steps": list(range(rows)),
                      "big": pa.array(big, pa.uint64())})
    table = table.set_column(2, "steps", pa.array([-5 if i == 242 else i for i in range(rows)]))
    os.makedirs(tmp_path / "src")
    pq.write_table(table.slice(0, 50).drop_null(), tmp_path / "src" / "a.parquet")
    pq.write_table(table, tmp_path / "src" / "b.parquet", row_group_size=100)
    return str(tmp_path / "src")


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


NULL = "column 'tokens': a value inside a list is null; tf.train.Feature cannot hold nulls"


@pytest.mark.parametrize("columns, problem", [
    ("key,tokens", NULL),
    ("key,big", "column 'big': a value exceeds the int64 range of tf.train.Int64List (uint64)"),
])
def test_convert_names_the_file_and_its_row(run_cli, src, tmp_path, columns, problem):
    (tmp_path / "out").mkdir()
    before = snapshot(src, tmp_path / "out"), listing(tmp_path / "out")
    line = one_line(run_cli("convert", src, tmp_path / "out" / "dst", "--to", "tfrecord", "--columns", columns))
    assert line == f"error: {src}/b.parquet, row 242, {problem}"
    assert (snapshot(src, tmp_path / "out"), listing(tmp_path / "out")) == before


@pytest.mark.parametrize("command", [
    ["shuffle"],
    ["select", "--columns", "key,tokens"],
    ["bucket", "--length", "tokens", "--boundaries", "2", "--batch-size", "4"],
    ["pack", "--max-length", "8", "--sequence", "tokens", "--batch-size", "2"],
])
def test_an_op_s_output_names_the_input_row_it_came_from(run_cli, src, tmp_path, command):
    line = one_line(run_cli(command[0], src, tmp_path / "dst", *command[1:], "--to", "tfrecord"))
    assert line.startswith(f"error: {src}/b.parquet, row 242, ") and "(the first such row of the input)" in line, line
    assert not (tmp_path / "dst").exists()


def test_a_negative_length_names_the_file_and_its_row(run_cli, src, tmp_path):
    assert one_line(run_cli("inspect", src, "--length", "steps")) == \
        f"error: {src}/b.parquet, row 242, column 'steps': a negative length (-5)"
    assert one_line(run_cli("bucket", src, tmp_path / "dst", "--length", "steps", "--boundaries", "3",
                            "--batch-size", "4")) == \
        f"error: {src}/b.parquet, row 242, column 'steps': a negative length (-5)"


def test_a_huge_length_is_refused_before_its_histogram_is_made(run_cli, tmp_path):
    """inspect counts lengths in a histogram up to the longest: a length in a file must not size it unchecked."""
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"n": [1, 2, 10**12]}), tmp_path / "src" / "a.parquet")
    assert one_line(run_cli("inspect", tmp_path / "src", "--length", "n")) == (
        f"error: {tmp_path}/src/a.parquet, row 2, column 'n': a length of 1,000,000,000,000: counting lengths up "
        "to it takes 8,000,000,000,008 bytes, more than --max-record-bytes allows (16,777,216); check the column, "
        "or raise --max-record-bytes if the length is genuine")
