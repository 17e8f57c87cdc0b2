"""Arrow IPC batch shards (`--to arrow`): round trips, determinism, `load` parity, other readers, damaged files."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from conftest import data_bytes, invoke_cli, write_parquet_shards
from strategies import record_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtool.io.inputs import open_dataset
from batchtool.loader.load import load
from batchtool.io.output import BatchShardWriter, OutputOptions, encode_batches
from batchtool.core.synthetic import make_table
import memlimit

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=record_batches(), codec=st.sampled_from(["none", "lz4", "zstd"]))
def test_round_trips_every_column_type(tmp_path_factory, batch, codec):
    out = str(tmp_path_factory.mktemp("arrow"))
    writer = BatchShardWriter(out, batch.schema, OutputOptions(format="arrow", compression=codec))
    writer.write(next(encode_batches([batch], writer.options)))
    writer.write(next(encode_batches([batch], writer.options)))
    files = writer.close()
    assert files[0]["path"] == "part-00000.arrow" and files[0]["batches"] == 2
    dataset = open_dataset(out)
    assert dataset.format == "arrow" and dataset.schema.equals(batch.schema)
    got = [chunk.data for chunk in dataset.chunks()]
    assert pa.Table.from_batches(got, batch.schema).equals(pa.Table.from_batches([batch, batch]))


def bucket(run_cli, src: str, dst: str, *extra: str) -> str:
    result = run_cli("bucket", src, dst, "--auto-buckets", "4", "--batch-size", "16", "--seed", "3", "--quiet", *extra)
    assert result.exit_code == 0, result.stderr
    return dst


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """The same bucket run written as each format (once for the module: its tests only read them)."""
    root = tmp_path_factory.mktemp("outputs")
    src = write_parquet_shards(str(root / "src"), make_table(300, seed=7))
    return {fmt: bucket(invoke_cli, src, str(root / fmt), "--to", fmt) for fmt in ("arrow", "parquet", "tfrecord")}


def test_output_is_byte_identical_across_threads_and_has_a_manifest(run_cli, parquet_src, tmp_path):
    one = bucket(run_cli, parquet_src, str(tmp_path / "one"), "--to", "arrow", "--threads", "1")
    two = bucket(run_cli, parquet_src, str(tmp_path / "two"), "--to", "arrow", "--threads", "2")
    assert data_bytes(one) == data_bytes(two) and list(data_bytes(one)) == ["part-00000.arrow"]
    manifest = load(one).manifest["output"]
    assert manifest["format"] == "arrow" and manifest["compression"] == "none"
    entry = manifest["files"][0]
    assert entry["rows"] == 300 and entry["bytes"] == os.path.getsize(os.path.join(one, entry["path"]))
    assert pa.ipc.open_file(os.path.join(one, entry["path"])).num_record_batches == entry["batches"]


def test_compression_and_shard_rollover(run_cli, parquet_src, tmp_path):
    dst = bucket(run_cli, parquet_src, str(tmp_path / "z"), "--to", "arrow", "--compression", "zstd",
                 "--shard-rows", "100")
    files = load(dst).manifest["output"]["files"]
    assert len(files) > 1 and all(f["path"].endswith(".arrow") for f in files)
    result = run_cli("bucket", parquet_src, str(tmp_path / "bad"), "--auto-buckets", "4", "--batch-size", "16",
                     "--to", "arrow", "--compression", "gzip")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --compression 'gzip': Arrow IPC takes none, lz4, zstd")


def same_batches(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for name in x:
            if x[name].dtype == object:
                assert all(np.array_equal(p, q) for p, q in zip(x[name], y[name], strict=True)), name
            else:
                assert np.array_equal(x[name], y[name]), name


@pytest.mark.parametrize("shuffle", [False, True])
def test_load_equals_parquet_and_tfrecord_batch_for_batch(outputs, shuffle):
    arrow = list(load(outputs["arrow"], shuffle=shuffle, seed=5))
    assert len(arrow) > 1
    for other in ("parquet", "tfrecord"):
        same_batches(arrow, load(outputs[other], shuffle=shuffle, seed=5))


def test_load_resumes_and_hands_out_read_only_views_of_the_map(outputs):
    loader = load(outputs["arrow"], shuffle=True, seed=2, writable=False)
    allocated = pa.total_allocated_bytes()
    first = list(loader)
    assert pa.total_allocated_bytes() <= allocated  # every number is a view of the memory map: nothing decoded
    assert sum(a.nbytes for batch in first for a in batch.values() if a.dtype != object) > 100_000
    loader.load_state_dict({**loader.state_dict(), "position": 3})
    same_batches(list(loader), first[3:])
    frames = first[0]["frames"]
    assert frames.ndim == 3 and not frames.flags.writeable and not frames.flags.owndata
    writable = next(iter(load(outputs["arrow"], shuffle=False)))["frames"]
    writable[0, 0, 0] = 1.0  # the default gives private, writable arrays (a copy of the map)
    assert load(outputs["arrow"]).batch_index()["rows"].sum() == 300


@pytest.mark.parametrize("command", [
    ["convert"], ["bucket", "--auto-buckets", "2", "--batch-size", "8"],
    ["segment", "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "10", "--batch-size", "4"],
    ["stratify", "--label", "label", "--target", "uniform"], ["shuffle", "--seed", "1"],
    ["resample", "--weight", "weight", "--overall-rate", "1.0"],
    ["pack", "--max-length", "512", "--batch-size", "4", "--split-long"],
])
def test_every_command_reads_arrow_input(run_cli, parquet_src, tmp_path, command):
    sources = {}
    for fmt in ("arrow", "parquet"):
        sources[fmt] = str(tmp_path / f"{fmt}_src")
        assert run_cli("convert", parquet_src, sources[fmt], "--to", fmt, "--quiet").exit_code == 0
    got = run_cli(command[0], sources["arrow"], tmp_path / "from_arrow", *command[1:], "--quiet")
    assert got.exit_code == 0, got.stderr
    want = run_cli(command[0], sources["parquet"], tmp_path / "from_parquet", *command[1:], "--quiet")
    assert want.exit_code == 0, want.stderr
    assert data_bytes(str(tmp_path / "from_arrow")) == data_bytes(str(tmp_path / "from_parquet"))


def arrow_file(outputs) -> str:
    return os.path.join(outputs["arrow"], "part-00000.arrow")


def test_pyarrow_polars_duckdb_read_the_output(outputs):
    expected = pa.ipc.open_file(arrow_file(outputs)).read_all()
    assert expected.num_rows == 300
    assert pads.dataset(outputs["arrow"], format="arrow").to_table().equals(expected)
    pl = pytest.importorskip("polars")
    assert pl.read_ipc(arrow_file(outputs)).to_arrow().to_pylist() == expected.to_pylist()
    assert pl.scan_ipc(os.path.join(outputs["arrow"], "*.arrow")).select(pl.len()).collect().item() == 300
    duckdb = pytest.importorskip("duckdb")
    shards = pa.ipc.open_file(arrow_file(outputs)).read_all()  # noqa: F841 (DuckDB scans the local by name)
    assert duckdb.sql("select count(*), sum(label) from shards").fetchall()[0] == \
        (300, sum(expected.column("label").to_pylist()))


def test_huggingface_datasets_reads_the_output(outputs, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    got = datasets.load_dataset("arrow", data_files=arrow_file(outputs), split="train",
                                cache_dir=str(tmp_path / "hf"))
    assert got.num_rows == 300 and got["key"] == pa.ipc.open_file(arrow_file(outputs)).read_all()["key"].to_pylist()


@pytest.fixture(scope="module")
def damaged_runs(tmp_path_factory, outputs) -> dict[str, tuple[str, memlimit.CliCase]]:
    """`convert` of the Arrow output damaged three ways (cut in half, its footer overwritten, garbage after the
    magic), each in a directory of its own: the damaged file and how the command ended, in a child process of its own
    (a crash in pyarrow on damaged input would end it, not the test run), one for the three."""
    data = open(arrow_file(outputs), "rb").read()
    paths = {}
    for how, damaged in {"truncated": data[:len(data) // 2], "footer": data[:-40] + b"\xff" * 30 + data[-10:],
                         "garbage": b"ARROW1\0\0" + b"\x07" * 200}.items():
        src = tmp_path_factory.mktemp(how) / "damaged"
        src.mkdir()
        (src / "part-00000.arrow").write_bytes(damaged)
        paths[how] = src / "part-00000.arrow"
    ran = memlimit.cli_cases({how: ["convert", path, path.parent.parent / "out"] for how, path in paths.items()},
                             limit_bytes=1 << 30)
    return {how: (str(path), ran[how]) for how, path in paths.items()}


@pytest.mark.parametrize("how", ["truncated", "footer", "garbage"])
def test_damaged_file_is_one_error_line_exit_2(damaged_runs, how):
    path, run = damaged_runs[how]
    assert run.code == 2 and run.crash is None, run
    assert run.stderr.startswith(f"error: {path}") and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert sorted(os.listdir(os.path.dirname(os.path.dirname(path)))) == ["damaged"]


def test_a_batch_whose_offsets_are_damaged_is_one_error_naming_the_batch(run_cli, parquet_src, tmp_path):
    src = str(tmp_path / "src_arrow")
    assert run_cli("convert", parquet_src, src, "--to", "arrow", "--quiet").exit_code == 0
    path = os.path.join(src, "part-00000.arrow")
    data = open(path, "rb").read()
    offsets = np.arange(0, 44, 11, dtype="<i4").tobytes()  # the `key` column's first offsets (11-byte keys)
    at = data.index(offsets)
    open(path, "wb").write(data[:at + 8] + np.int32(1 << 30).tobytes() + data[at + 12:])
    result = run_cli("convert", src, tmp_path / "out", "--quiet")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.startswith(f"error: {path}, record batch 0, column 'key': corrupt") and \
        len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_segment_output_loads_the_same_in_every_format_and_threads(run_cli, parquet_src, tmp_path):
    loaded = {}
    for fmt, threads in (("arrow", "1"), ("arrow", "2"), ("parquet", "1"), ("tfrecord", "1")):
        dst = tmp_path / f"{fmt}{threads}"
        result = run_cli("segment", parquet_src, dst, "--key", "key", "--sequence", "tokens,frames",
                         "--num-unroll", "10", "--batch-size", "4", "--to", fmt, "--threads", threads, "--quiet")
        assert result.exit_code == 0, result.stderr
        loaded[fmt + threads] = list(load(str(dst)))
    assert data_bytes(str(tmp_path / "arrow1")) == data_bytes(str(tmp_path / "arrow2"))
    for other in ("parquet1", "tfrecord1"):
        same_batches(loaded["arrow1"], loaded[other])


def _encoded_bytes(batch: pa.RecordBatch) -> bytes:
    encoded = next(encode_batches([batch], OutputOptions(format="arrow")))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, encoded.data.schema) as writer:
        writer.write_batch(encoded.data, custom_metadata=encoded.metadata)
    return sink.getvalue().to_pybytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.booleans()), min_size=1, max_size=40), st.data())
def test_arrow_bytes_depend_on_the_values_not_on_what_a_batch_was_cut_from(values, data):
    """A boolean or validity bitmap cut mid-byte keeps its parent's next bits, which the IPC writer would store (and
    the CRC32C cover): a batch cut from a longer one (a key range's rows, another --threads) encodes as a fresh one."""
    before = data.draw(st.lists(st.one_of(st.none(), st.booleans()), max_size=20))
    after = data.draw(st.lists(st.one_of(st.none(), st.booleans()), min_size=1, max_size=20))

    def batch(rows: list) -> pa.RecordBatch:
        return pa.record_batch({"flag": pa.array(rows, pa.bool_()),
                                "ints": pa.array([None if v is None else int(v) for v in rows], pa.int64()),
                                "steps": pa.array([[v, v] for v in rows], pa.list_(pa.bool_()))})

    cut = batch(before + values + after).slice(len(before), len(values))
    assert _encoded_bytes(cut) == _encoded_bytes(batch(values))
