"""Hugging Face `datasets` directories as SRC: a save_to_disk split is read by every command with the rows `datasets`
gives; a DatasetDict root and a state.json that leaves the directory are one error line."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchtool.io.dataset import ReadReport
from batchtool.io.inputs import open_dataset
from batchtool.core.synthetic import make_table
from conftest import read_dir
from dirstate import listing, snapshot


@pytest.fixture(scope="module")
def table() -> pa.Table:
    """The corpus, with a feature of nested lists of any length (a Sequence of Sequences in `datasets`)."""
    corpus = make_table(240, seed=5)
    spans = pa.array([[list(range(i % 3)), [i]] if i % 4 else [] for i in range(240)], pa.list_(pa.list_(pa.int64())))
    return corpus.append_column("spans", spans)


@pytest.fixture(scope="module")
def split(datasets, table, tmp_path_factory) -> str:
    """`Dataset.save_to_disk` of the corpus in 3 shards, written by the real library."""
    path = str(tmp_path_factory.mktemp("hf") / "train")
    datasets.Dataset(table).save_to_disk(path, num_shards=3)
    return path


def parquet_twin(table: pa.Table, directory: str, shards: list[int]) -> str:
    """The same rows as Parquet files of the same shard sizes, so examples have the same ids (shard, row)."""
    os.makedirs(directory)
    start = 0
    for i, rows in enumerate(shards):
        pq.write_table(table.slice(start, rows), os.path.join(directory, f"part-{i:05d}.parquet"))
        start += rows
    return directory


def test_the_rows_are_the_ones_datasets_gives_in_state_json_order(datasets, split, tmp_path):
    moved = str(tmp_path / "moved")
    shutil.copytree(split, moved)
    state_path = os.path.join(moved, "state.json")
    state = json.load(open(state_path))
    state["_data_files"].reverse()  # the order state.json gives is the order, not the file names'
    json.dump(state, open(state_path, "w"))
    for path in (split, moved):
        dataset = open_dataset(path)
        got = pa.Table.from_batches([c.data for c in dataset.chunks()], dataset.schema)
        assert dataset.format == "arrow" and len(dataset.shards) == 3
        assert got.equals(datasets.load_from_disk(path).data.table)
    assert [os.path.basename(s.path) for s in open_dataset(moved).shards] == \
        [f["filename"] for f in state["_data_files"]]


COMMANDS = [
    ["convert"],
    ["stratify", "--label", "label", "--target", "uniform"],
    ["resample", "--weight", "weight", "--overall-rate", "1.0"],
    ["shuffle", "--seed", "1"],
    ["bucket", "--length", "tokens", "--sequence", "tokens,frames", "--auto-buckets", "2", "--batch-size", "8"],
    ["pack", "--max-length", "512", "--sequence", "tokens,frames", "--batch-size", "4", "--split-long"],
    ["segment", "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "10", "--batch-size", "4"],
    ["select", "--columns", "spans,key"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_reads_a_save_to_disk_split(run_cli, datasets, split, tmp_path, command):
    dataset = open_dataset(split)
    shards = [dataset.spec.count_rows(dataset, shard, ReadReport()) for shard in dataset.shards]
    twin = parquet_twin(datasets.load_from_disk(split).data.table, str(tmp_path / "twin"), shards)
    for src, dst in ((split, tmp_path / "from_hf"), (twin, tmp_path / "from_parquet")):
        result = run_cli(command[0], src, dst, *command[1:], "--to", "parquet", "-q")
        assert result.exit_code == 0, result.stderr
    assert read_dir(str(tmp_path / "from_hf")).equals(read_dir(str(tmp_path / "from_parquet")))


def test_inspect_and_check_read_a_split(run_cli, split, table):
    result = run_cli("inspect", split, "--json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["rows"] == 240 and [s["rows"] for s in shown["shards"]] == [80, 80, 80]
    assert shown["label"]["counts"] == {str(k): v for k, v in Counter(table["label"].to_pylist()).items()}
    assert run_cli("check", split, "--min-rows", "240", "--no-nulls", "key").exit_code == 0


def one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_dataset_dict_root_is_one_error_naming_its_splits(run_cli, datasets, table, tmp_path):
    root = str(tmp_path / "dd")
    datasets.DatasetDict({"train": datasets.Dataset(table), "test": datasets.Dataset(table.slice(0, 10))}) \
        .save_to_disk(root)
    (tmp_path / "out").mkdir()
    before = snapshot(root, tmp_path / "out"), listing(tmp_path / "out")
    for args in (["convert", root, tmp_path / "out" / "dst"], ["inspect", root]):
        assert one_error(run_cli(*args)) == (
            f"error: {root}: a Hugging Face DatasetDict of 2 split(s) ('train', 'test'), not one dataset; give one "
            f"split's directory as SRC, e.g. {root}/train")
    assert (snapshot(root, tmp_path / "out"), listing(tmp_path / "out")) == before
    assert run_cli("convert", f"{root}/test", tmp_path / "out" / "dst", "-q").exit_code == 0


@pytest.mark.parametrize("name, why", [
    ("../outside.arrow", "leaves the dataset directory"),
    ("/etc/passwd", "is absolute; paths in a manifest are relative to its directory"),
    ("inner/../../outside.arrow", "leaves the dataset directory"),
])
def test_a_state_json_path_out_of_the_directory_is_refused_before_reading(run_cli, split, tmp_path, name, why):
    moved = tmp_path / "split"
    shutil.copytree(split, moved)
    shutil.copy(moved / "data-00000-of-00003.arrow", tmp_path / "outside.arrow")
    state = json.loads((moved / "state.json").read_text())
    state["_data_files"][1]["filename"] = name
    (moved / "state.json").write_text(json.dumps(state))
    assert one_error(run_cli("convert", moved, tmp_path / "dst")) == \
        f"error: {moved}/state.json: _data_files[1].filename {name!r} {why}"
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("damage", ["too large", "not JSON"])
def test_a_state_json_too_large_or_unreadable_is_one_error_line(run_cli, split, tmp_path, damage):
    """Its size is checked before anything is read (a sparse 64 MB + 1 file here is never read)."""
    moved = tmp_path / "split"
    shutil.copytree(split, moved)
    with open(moved / "state.json", "wb") as f:
        if damage == "too large":
            f.truncate((64 << 20) + 1)
        else:
            f.write(b'{"_data_files": [')
    expected = ("67,108,865 bytes, too large for a Hugging Face datasets file (at most 67,108,864)"
                if damage == "too large" else "unreadable (")
    line = one_error(run_cli("convert", moved, tmp_path / "dst"))
    assert line.startswith(f"error: {moved}/state.json: {expected}"), line
    assert not (tmp_path / "dst").exists()


def test_one_stream_file_of_a_split_is_an_arrow_input(run_cli, datasets, split, tmp_path):
    path = os.path.join(split, "data-00001-of-00003.arrow")
    assert run_cli("convert", path, tmp_path / "dst", "-q").exit_code == 0
    assert read_dir(str(tmp_path / "dst")).equals(datasets.Dataset.from_file(path).data.table)
