"""End-to-end CLI: inspect and convert, determinism across threads, errors and exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from memlimit import HANG_GUARD
from batchtool.cli import cli
from conftest import SAMPLE, data_bytes, read_dir
from parked_cli import start_parked


def test_version_and_every_command_help_has_an_example(run_cli):
    assert run_cli("--version").output.startswith("batchtool, version")
    for name in cli.commands:
        result = run_cli(name, "--help")
        assert result.exit_code == 0
        assert "Example:" in result.output and f"batchtool {name}" in result.output


def test_the_program_says_its_version_as_click_does_without_the_heavy_imports(run_cli):
    """`batchtool --version` answers before the command line's imports (pyarrow, numpy, click): the same line."""
    probe = ("import runpy, sys; sys.argv = ['batchtool', '--version']\n"
             "try:\n    runpy.run_module('batchtool', run_name='__main__')\n"
             "finally:\n    print(sorted(m for m in ('pyarrow', 'numpy', 'click') if m in sys.modules))")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG_GUARD,
                           env={**os.environ, "PYTHONPATH": repo}, check=True)
    assert child.stdout == run_cli("--version").output + "[]\n"


def test_inspect_sample_parquet_text_and_json(run_cli):
    text = run_cli("inspect", os.path.join(SAMPLE, "parquet"))
    assert text.exit_code == 0, text.output
    assert "label distribution (label, 4 classes)" in text.output
    assert "lengths (tokens)" in text.output and "█" in text.output
    data = json.loads(run_cli("inspect", os.path.join(SAMPLE, "parquet"), "--json").output)
    assert data["rows"] == sum(s["rows"] for s in data["shards"]) == 4000
    assert sum(data["label"]["counts"].values()) == 4000
    assert data["label"]["counts"]["0"] > 0.8 * 4000
    assert data["length"]["count"] == 4000 and data["length"]["min"] >= 1


def test_inspect_tfrecord_matches_parquet(run_cli):
    pq_json = json.loads(run_cli("inspect", os.path.join(SAMPLE, "parquet"), "--length", "tokens", "--json").output)
    tf_json = json.loads(run_cli("inspect", os.path.join(SAMPLE, "tfrecord"), "--length", "tokens", "--json").output)
    assert tf_json["tfrecord_kind"] == "sequence_example"
    assert {c["name"] for c in tf_json["schema"]} == {c["name"] for c in pq_json["schema"]}
    assert tf_json["rows"] == pq_json["rows"]
    assert tf_json["label"] == pq_json["label"]
    assert tf_json["length"] == pq_json["length"]


def test_parquet_tfrecord_parquet_round_trip_keeps_values_and_types(tmp_path, parquet_src, corpus, run_cli):
    tfr, back = tmp_path / "tfr", tmp_path / "back"
    assert run_cli("convert", parquet_src, tfr, "--to", "tfrecord", "--compression", "gzip", "-q").exit_code == 0
    assert all(f.endswith(".tfrecord.gz") for f in os.listdir(tfr) if f.startswith("part-"))
    assert run_cli("convert", tfr, back, "-q").exit_code == 0
    assert read_dir(str(back)).equals(corpus)


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_threads_1_and_4_give_identical_bytes(tmp_path, parquet_src, run_cli, to):
    for threads in (1, 4):
        result = run_cli("convert", parquet_src, tmp_path / f"t{threads}", "--to", to, "--threads", threads,
                         "--shard-rows", 100, "-q")
        assert result.exit_code == 0, result.output
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t4"))
    assert len(data_bytes(str(tmp_path / "t1"))) == 3


def test_manifest_records_inputs_outputs_and_options(tmp_path, parquet_src, run_cli):
    run_cli("convert", parquet_src, tmp_path / "out", "--columns", "key,label", "-q")
    manifest = json.load(open(tmp_path / "out" / ".batchtool_manifest.json"))
    assert manifest["command"] == "convert"
    assert manifest["options"]["columns"] == ["key", "label"]
    assert [os.path.basename(f["path"]) for f in manifest["inputs"]["files"]] == ["part-00000.parquet",
                                                                                   "part-00001.parquet"]
    assert all(f["fingerprint"].startswith("sha256-ends:") for f in manifest["inputs"]["files"])
    assert manifest["output"]["rows"] == manifest["stats"]["rows_in"] == 300
    assert [c["name"] for c in manifest["columns"]] == ["key", "label"]
    assert pq.read_table(tmp_path / "out" / manifest["output"]["files"][0]["path"]).num_rows == 300


def errors_cases(tmp_path, parquet_src):
    empty = tmp_path / "empty"
    empty.mkdir()
    unknown = tmp_path / "data.csv"
    unknown.write_text("a,b\n")
    return [
        (["convert", tmp_path / "nope", "DST"], "no such file or directory"),
        (["convert", empty, "DST"], "empty input"),
        (["convert", unknown, "DST"], "unknown format"),
        (["convert", parquet_src, "DST", "--columns", "key,nope"], "no column 'nope' (available: key, label"),
        (["convert", parquet_src, "DST", "--compression", "lzma"], "--compression 'lzma'"),
        (["inspect", parquet_src, "--length", "key"], "column 'key' is string"),
    ]


def test_errors_exit_2_with_one_line_and_leave_no_dst(tmp_path, parquet_src, run_cli):
    for args, message in errors_cases(tmp_path, parquet_src):
        args = [tmp_path / "dst" if a == "DST" else a for a in args]
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, result.stderr)
        assert not (tmp_path / "dst").exists()
    assert sorted(os.listdir(tmp_path)) == ["data.csv", "empty", "src"]


def test_existing_dst_is_refused_then_replaced_with_overwrite(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "precious").write_text("x")
    result = run_cli("convert", parquet_src, dst)
    assert result.exit_code == 2 and "destination exists" in result.stderr
    assert os.listdir(dst) == ["precious"]
    assert run_cli("convert", parquet_src, dst, "--overwrite", "-q").exit_code == 0
    assert "precious" not in os.listdir(dst) and ".batchtool_manifest.json" in os.listdir(dst)


def test_debug_shows_the_traceback(tmp_path, run_cli):
    with pytest.raises(Exception, match="no such file"):
        run_cli("--debug", "inspect", tmp_path / "nope")


def test_sigint_mid_run_leaves_dst_as_it_was(tmp_path, parquet_src):
    """Ctrl-C while shards are being written (the child parks there until the signal: no timing)."""
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old").write_text("previous run")
    proc = start_parked("pass:convert: write", "convert", parquet_src, dst, "--overwrite", "--to", "tfrecord",
                        "--shard-rows", "50", "--threads", "2")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".dst.tmp-")]  # the run is writing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130, err
    assert err == "error: interrupted by SIGINT; temporary files removed\n"
    assert os.listdir(dst) == ["old"]
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]