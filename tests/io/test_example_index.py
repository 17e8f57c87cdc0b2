"""The example index every batch output carries: each batch's example keys, from the data files (their key column) or
the input rows their batches carried."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from conftest import write_parquet_shards
from load_outputs import QUIET, bucket_output, manifest_file, segment_output

import batchtool
from batchtool.core.errors import InputError
from batchtool.core.run_settings import RunSettings
from batchtool.core.synthetic import make_table
from batchtool.exec.driver import run_operation
from batchtool.io.example_index import INDEX_NAME, open_index
from batchtool.io.output import OutputOptions
from batchtool.ops.pack import OP as PACK
from batchtool.ops.pack.options import PackOptions
from batchtool.ops.shuffle import OP as SHUFFLE


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("indexed"))


def index_table(dst: str) -> pa.Table:
    with pa.memory_map(os.path.join(dst, INDEX_NAME)) as f:
        return pa.ipc.open_file(f).read_all()


def batches_in_file_order(dst: str, column: str = "key") -> list[list]:
    source = batchtool.source(dst)
    return [source[i][column].tolist() for i in range(len(source))]


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "tfrecord"])
def test_bucket_index_holds_each_batch_keys_in_order(root, fmt):
    dst = bucket_output(root, fmt)
    table = index_table(dst)
    expected = batches_in_file_order(dst)
    assert table.column("key").to_pylist() == [k for keys in expected for k in keys]
    assert table.column("batch").to_pylist() == [b for b, keys in enumerate(expected) for _ in keys]
    pairs = list(zip(table.column("key").to_pylist(), table.column("batch").to_pylist()))
    assert [pairs[i] for i in table.column("by_key").to_pylist()] == sorted(pairs)


def test_the_index_is_the_same_bytes_for_any_format_and_threads(root, tmp_path):
    again = str(tmp_path / "again")
    from batchtool.ops.bucket import OP, BucketOptions
    from load_outputs import source

    run_operation(OP, BucketOptions(boundaries=(20, 40), batch_size=(11,)), source(root), again,
                  OutputOptions(format="arrow", shard_rows=100), RunSettings(threads=1, quiet=True), seed=1)
    first = open(os.path.join(bucket_output(root, "parquet"), INDEX_NAME), "rb").read()
    assert open(os.path.join(again, INDEX_NAME), "rb").read() == first
    manifest = json.load(open(manifest_file(again)))
    entry = manifest["output"]["index"]
    assert entry["path"] == INDEX_NAME and entry["key"] == "key" and entry["bytes"] == len(first)
    assert entry["examples"] == manifest["output"]["rows"]


def test_segment_keys_are_the_segments_keys(root):
    dst = segment_output(root)
    assert index_table(dst).column("key").to_pylist() == [k for keys in batches_in_file_order(dst) for k in keys]


def test_pack_indexes_each_packed_document(root, tmp_path):
    src = write_parquet_shards(str(tmp_path / "src"), make_table(60, seed=3, max_length=50))
    dst = str(tmp_path / "packed")
    run_operation(PACK, PackOptions(max_length=64, sequence=("tokens", "frames")), src, dst,
                  OutputOptions(format="parquet"), QUIET)
    table = index_table(dst)
    assert sorted(table.column("key").to_pylist()) == [f"ex-{i:08d}" for i in range(60)]
    rows = batches_in_file_order(dst)
    assert table.column("key").to_pylist() == [k for batch in rows for row in batch for k in row]


def test_without_a_key_column_an_example_is_its_row_in_the_input(root, tmp_path):
    table = make_table(50, seed=2).drop(["key"])
    src = write_parquet_shards(str(tmp_path / "src"), table.append_column("row", pa.array(range(50))))
    dst = str(tmp_path / "unkeyed")
    from batchtool.ops.bucket import OP, BucketOptions

    run_operation(OP, BucketOptions(boundaries=(20,), batch_size=(8,)), src, dst, OutputOptions(format="parquet"),
                  QUIET, seed=1)
    table = index_table(dst)
    rows = batches_in_file_order(dst, "row")
    assert table.column("key").to_pylist() == [r for batch in rows for r in batch]
    assert sorted(table.column("key").to_pylist()) == list(range(50))
    assert table.column("batch").to_pylist() == [b for b, batch in enumerate(rows) for _ in batch]
    entry = json.load(open(manifest_file(dst)))["output"]["index"]
    assert entry["key"] is None and entry["rows"] == "input"


def test_row_outputs_have_no_index(root, tmp_path):
    dst = str(tmp_path / "shuffled")
    from batchtool.ops.shuffle import ShuffleOptions

    run_operation(SHUFFLE, ShuffleOptions(), write_parquet_shards(str(tmp_path / "src"), make_table(20, seed=1)), dst,
                  OutputOptions(format="parquet"), QUIET)
    assert not os.path.exists(os.path.join(dst, INDEX_NAME))
    assert "index" not in json.load(open(manifest_file(dst)))["output"]


def test_an_index_that_is_not_the_outputs_is_refused(root, tmp_path):
    import shutil

    dst = shutil.copytree(bucket_output(root, "parquet"), str(tmp_path / "copy"))
    manifest = json.load(open(manifest_file(dst)))
    with open(os.path.join(dst, INDEX_NAME), "ab") as f:
        f.write(b"x")
    with pytest.raises(InputError, match="the index is not this output's"):
        open_index(dst, manifest)
    os.remove(os.path.join(dst, INDEX_NAME))
    with pytest.raises(InputError, match="missing"):
        open_index(dst, manifest)


_BUILD_GROWTH = """
import json, os, sys
from batchtool.io import example_index
from batchtool.io.workspace import Workspace
dst, memory, space = sys.argv[1], int(sys.argv[2]), Workspace(sys.argv[3], sys.argv[1])
manifest = json.load(open(os.path.join(dst, ".batchtool_manifest.json")))
recorded = manifest["output"].pop("index")
def rss(field):
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(field)).split()[1]) << 10
example_index.build_index(dst, manifest, space, memory)  # imports and caches: the build measured starts warm
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = rss("VmRSS:")
entry = example_index.build_index(dst, manifest, space, memory)
print(json.dumps({"same": entry == recorded, "grew": rss("VmHWM:") - base}))
"""
_BIG_KEYS = 400
_KEY_BYTES = 48_000
"""400 keys of 48 kB: an index of 19 MB, which a build holding every key and their sort holds twice over."""


def test_a_large_index_is_built_under_a_small_memory(tmp_path):
    """The build holds what --memory allows, not the keys: 19 MB of keys sorted under 8 MB (runs spilled and
    merged) give the bytes the default --memory gave (one run, sorted in memory)."""
    import sys

    import memlimit
    import numpy as np
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "src")
    keys = pa.array([f"{i:05d}".ljust(_KEY_BYTES, "k") for i in range(_BIG_KEYS)][::-1])
    steps = pa.ListArray.from_arrays(pa.array(np.arange(_BIG_KEYS + 1, dtype=np.int32)),
                                     pa.array(np.ones(_BIG_KEYS, dtype=np.int8)))
    pq.write_table(pa.table({"key": keys, "tokens": steps}), tmp_path / "src" / "part-0.parquet", row_group_size=32)
    dst = str(tmp_path / "dst")
    from batchtool.ops.bucket import OP, BucketOptions

    run_operation(OP, BucketOptions(boundaries=(2,), batch_size=(16,), sequence=("tokens",)), str(tmp_path / "src"),
                  dst, OutputOptions(format="parquet"), QUIET, seed=1)  # the default --memory: one run in memory
    os.makedirs(tmp_path / "space")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = memlimit.run_capped([sys.executable, "-c", _BUILD_GROWTH, dst, str(8 << 20), str(tmp_path / "space")],
                                1 << 30, env={**os.environ, "PYTHONPATH": repo})
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["same"]
    assert result["grew"] < 12 << 20, result["grew"] >> 20  # holding every key and its sort: about 38 MB


def test_an_index_that_does_not_read_back_fails_the_write_and_leaves_no_output(tmp_path, monkeypatch, run_cli):
    """A pyarrow whose IPC layout the patched template no longer matches: the command ends in one line, DST absent."""
    from batchtool.io import example_index

    def a_row_short(write, schema, rows, buffers):  # a file that claims one row fewer than the index holds
        table = pa.table({name: pa.array(range(max(rows - 1, 0)), pa.int64()) for name in schema.names})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        write(sink.getvalue().to_pybytes())

    monkeypatch.setattr(example_index, "write_single_batch", a_row_short)
    src = write_parquet_shards(str(tmp_path / "src"), make_table(40, seed=1), shards=1)
    result = run_cli("bucket", src, tmp_path / "dst", "--boundaries", "20", "--batch-size", "4", "-q")
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "the example index written does not read back as written" in result.stderr
    assert not os.path.exists(tmp_path / "dst")
