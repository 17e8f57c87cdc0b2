"""A user's `length` column through every command, without a rename stage: (a) one that holds each example's steps
is taken for pack's and segment's own `length` (bucket's too), and (b) one in seconds stays the user's, with the
command's own column named otherwise by --output-column (one mechanism for every op, its pipeline key
`output-column` the same). Outputs whose own columns are renamed still load, inspect and check by the manifest's
names."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import batchtool
from batchtool.io.manifest import MANIFEST_NAME
from conftest import data_bytes, read_dir, write_parquet_shards

PACK = ["--max-length", "128", "--split-long", "--batch-size", "4", "--seed", "3"]
SEGMENT = ["--key", "key", "--sequence", "tokens,frames", "--num-unroll", "20", "--batch-size", "8"]
BUCKET = ["--auto-buckets", "3", "--batch-size", "8", "--seed", "2"]


def steps_of(table: pa.Table) -> pa.Array:
    return pc.list_value_length(table.column("tokens")).cast(pa.int64()).combine_chunks()


@pytest.fixture
def sources(tmp_path, corpus) -> dict[str, str]:
    """The corpus without a length column (`plain`), with one holding the steps (`steps`), and with one in seconds
    (`seconds`, 10 ms a step)."""
    seconds = pc.multiply(steps_of(corpus).cast(pa.float64()), 0.01)
    return {"plain": write_parquet_shards(str(tmp_path / "plain"), corpus),
            "steps": write_parquet_shards(str(tmp_path / "steps"), corpus.append_column("length", steps_of(corpus))),
            "seconds": write_parquet_shards(str(tmp_path / "seconds"), corpus.append_column("length", seconds))}


def seconds_by_key(corpus: pa.Table) -> dict[str, float]:
    return dict(zip(corpus.column("key").to_pylist(), (0.01 * steps_of(corpus).to_numpy()).tolist()))


@pytest.mark.parametrize("command, args", [("pack", PACK), ("segment", SEGMENT), ("bucket", BUCKET)])
def test_a_length_column_that_holds_the_steps_is_taken_for_the_commands_own(tmp_path, sources, run_cli, command,
                                                                              args):
    """The output is the one of the same data without that column: the command's `length`, written once."""
    for name in ("plain", "steps"):
        result = run_cli(command, sources[name], tmp_path / f"{command}-{name}", *args, "-q")
        assert result.exit_code == 0, result.stderr
    assert data_bytes(str(tmp_path / f"{command}-plain")) == data_bytes(str(tmp_path / f"{command}-steps"))


@pytest.mark.parametrize("command, args, message", [
    ("pack", PACK, "column 'length' is also an output column of pack; name pack's otherwise with --output-column "
                   "length=NEW_NAME (or rename yours"),
    ("segment", SEGMENT, "column 'length' is also an output column of segment; name segment's otherwise with "
                         "--output-column length=NEW_NAME, or give yours as --input-length if it counts real steps, "
                         "or name the columns to copy with --context"),
    ("bucket", BUCKET, "column 'length' is also an output column of bucket; name bucket's otherwise with "
                       "--output-column length=NEW_NAME"),
])
def test_a_length_in_seconds_is_never_taken_for_steps(tmp_path, sources, run_cli, command, args, message):
    before = sorted(os.listdir(tmp_path))
    result = run_cli(command, sources["seconds"], tmp_path / "dst", *args)
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {sources['seconds']}: {message}")
    assert result.stderr.count("\n") == 1 and sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("command, args", [("pack", PACK), ("segment", SEGMENT)])
def test_an_integer_length_that_is_not_the_steps_names_the_row_and_both_ways_out(tmp_path, corpus, run_cli, command,
                                                                                 args):
    milliseconds = pc.multiply(steps_of(corpus), 10)
    src = write_parquet_shards(str(tmp_path / "ms"), corpus.append_column("length", milliseconds), shards=1)
    result = run_cli(command, src, tmp_path / "dst", *args)
    steps = steps_of(corpus)[0].as_py()
    where = f"error: {src}/part-00000.parquet, row 0, column 'length': {10 * steps} but "
    assert result.exit_code == 2 and result.stderr.startswith(where) and result.stderr.count("\n") == 1
    assert f"{command} writes its own 'length' column" in result.stderr
    assert "--output-column length=NEW_NAME" in result.stderr
    assert ("--input-length" in result.stderr) == (command == "segment")
    assert sorted(os.listdir(tmp_path)) == ["ms"]


def test_pack_with_a_length_in_seconds_and_its_own_named_steps(tmp_path, corpus, sources, run_cli):
    assert run_cli("pack", sources["plain"], tmp_path / "out-plain", *PACK, "-q").exit_code == 0
    result = run_cli("pack", sources["seconds"], tmp_path / "out", *PACK, "--output-column", "length=steps", "-q")
    assert result.exit_code == 0, result.stderr
    plain, out = read_dir(str(tmp_path / "out-plain")), read_dir(str(tmp_path / "out"))
    assert out.column("steps").equals(plain.column("length"))
    seconds = seconds_by_key(corpus)
    assert out.column("length").to_pylist() == [[seconds[k] for k in keys] for keys in out.column("key").to_pylist()]
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["options"]["output_columns"] == {"length": "steps"}


def test_segment_with_a_length_in_seconds_and_its_own_named_otherwise(tmp_path, corpus, sources, run_cli):
    assert run_cli("segment", sources["plain"], tmp_path / "out-plain", *SEGMENT, "-q").exit_code == 0
    result = run_cli("segment", sources["seconds"], tmp_path / "out", *SEGMENT, "--output-column",
                     "length=seg_length,total_length=steps", "-q")
    assert result.exit_code == 0, result.stderr
    plain, out = read_dir(str(tmp_path / "out-plain")), read_dir(str(tmp_path / "out"))
    assert out.column("seg_length").equals(plain.column("length"))
    assert out.column("steps").equals(plain.column("total_length"))
    seconds = seconds_by_key(corpus)
    keys, lengths = out.column("key").to_pylist(), out.column("length").to_pylist()
    real = [(k.partition(":")[2], s) for k, s in zip(keys, lengths) if k]
    assert all(s == seconds[k] for k, s in real) and len(real) == len(keys) - keys.count("")


def test_bucket_length_length_keeps_working(tmp_path, sources, run_cli):
    """`bucket --length length` buckets by the user's steps column, which is bucket's own `length` then."""
    for name in ("plain", "steps"):
        by = ["--length", "length"] if name == "steps" else []
        assert run_cli("bucket", sources[name], tmp_path / f"out-{name}", *BUCKET, *by, "-q").exit_code == 0
    assert data_bytes(str(tmp_path / "out-plain")) == data_bytes(str(tmp_path / "out-steps"))
    ok = run_cli("bucket", sources["seconds"], tmp_path / "sec", *BUCKET, "--output-column", "length=steps", "-q")
    assert ok.exit_code == 0, ok.stderr
    out = read_dir(str(tmp_path / "sec"))
    assert out.column("steps").equals(read_dir(str(tmp_path / "out-plain")).column("length"))


@pytest.mark.parametrize("name", ["steps", "seconds"])
def test_stratify_shuffle_and_resample_carry_a_length_column_through(tmp_path, corpus, sources, run_cli, name):
    length = dict(zip(corpus.column("key").to_pylist(), read_dir(sources[name]).column("length").to_pylist()))
    runs = {"stratify": ["--target", "uniform"], "shuffle": ["--seed", "1"], "resample": ["--rate", "1.5"],
            "balanced": ["--target", "uniform", "--balanced-batches", "--batch-size", "4"]}
    for command, args in runs.items():
        dst = tmp_path / f"{command}-{name}"
        result = run_cli("stratify" if command == "balanced" else command, sources[name], dst, *args, "-q")
        assert result.exit_code == 0, result.stderr
        out = read_dir(str(dst))
        assert out.num_rows and [length[k] for k in out.column("key").to_pylist()] == out.column("length").to_pylist()
    shuffled = read_dir(str(tmp_path / f"shuffle-{name}"))
    assert sorted(shuffled.column("key").to_pylist()) == sorted(length)


def test_pipelines_take_output_column_as_a_key_and_need_no_rename_stage(tmp_path, sources, run_cli):
    for name, keys in (("steps", ""), ("seconds", 'output-column = {length = "steps"}\n')):
        pipeline = tmp_path / f"{name}.toml"
        pipeline.write_text(f'seed = 3\n[input]\npath = "{sources[name]}"\n[[stage]]\nop = "shuffle"\n'
                            f'[[stage]]\nop = "segment"\nkey = "key"\nsequence = ["tokens", "frames"]\n'
                            f'num-unroll = 20\nbatch-size = 8\n{keys}[output]\npath = "{tmp_path / ("run-" + name)}"\n')
        assert run_cli("run", pipeline, "-q").exit_code == 0
        assert run_cli("shuffle", sources[name], tmp_path / f"shuffled-{name}", "--seed", "3", "-q").exit_code == 0
        extra = ["--output-column", "length=steps"] if keys else []
        assert run_cli("segment", tmp_path / f"shuffled-{name}", tmp_path / f"chained-{name}", *SEGMENT, *extra,
                       "-q").exit_code == 0
        assert data_bytes(str(tmp_path / f"run-{name}")) == data_bytes(str(tmp_path / f"chained-{name}"))
    shown = run_cli("inspect", tmp_path / "run-seconds")
    assert shown.exit_code == 0 and "total_length (of the examples)" in shown.output


def test_renamed_outputs_load_inspect_and_check_by_the_manifests_names(tmp_path, sources, run_cli):
    names = ["--output-column", "key=seg_key,sequence=seg,total_length=total,lane=slot,batch=b"]
    for to in ("arrow", "tfrecord"):
        result = run_cli("segment", sources["plain"], tmp_path / f"seg-{to}", *SEGMENT, *names, "--to", to, "-q")
        assert result.exit_code == 0, result.stderr
        checked = run_cli("check", tmp_path / f"seg-{to}")
        assert checked.exit_code == 0 and "manifest_batches  PASS" in checked.output, checked.output
    assert run_cli("segment", sources["plain"], tmp_path / "seg-plain", *SEGMENT, "-q").exit_code == 0
    shown = json.loads(run_cli("inspect", tmp_path / "seg-arrow", "--json").output)
    plain = json.loads(run_cli("inspect", tmp_path / "seg-plain", "--json").output)
    assert shown["segments"] == plain["segments"] and shown["length"]["column"] == "total (of the examples)"
    assert {k: v for k, v in shown["length"].items() if k != "column"} == \
        {k: v for k, v in plain["length"].items() if k != "column"}
    renamed, original = batchtool.load(str(tmp_path / "seg-tfrecord")), batchtool.load(str(tmp_path / "seg-plain"))
    assert renamed.num_lanes == original.num_lanes == 8
    for a, b in zip(renamed, original, strict=True):
        assert np.array_equal(a["slot"], b["lane"]) and np.array_equal(a["b"], b["batch"])

    result = run_cli("bucket", sources["plain"], tmp_path / "bucketed", *BUCKET, "--output-column",
                     "bucket=bin,batch=b", "--to", "parquet", "-q")
    assert result.exit_code == 0, result.stderr
    index = batchtool.load(str(tmp_path / "bucketed"), shuffle=False).batch_index()
    assert "bucket" in index and (index["bucket"] >= 0).all() and len(set(index["bucket"].tolist())) == 3
    shown = run_cli("inspect", tmp_path / "bucketed", "--json")
    assert json.loads(shown.output)["length"]["column"] == "length"
    assert run_cli("check", tmp_path / "bucketed", "--min-bucket-padding-efficiency", "0.1").exit_code == 0


def test_a_malformed_recorded_name_is_one_line(tmp_path, sources, run_cli):
    dst = tmp_path / "seg"
    assert run_cli("segment", sources["plain"], dst, *SEGMENT, "--output-column", "lane=slot", "-q").exit_code == 0
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    manifest["options"]["output_columns"] = {"lane": 3}
    (dst / MANIFEST_NAME).write_text(json.dumps(manifest))
    result = run_cli("inspect", dst)
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {dst / MANIFEST_NAME}: options.output_columns ")
    assert result.stderr.count("\n") == 1
