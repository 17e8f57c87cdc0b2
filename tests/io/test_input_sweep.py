"""Sizes and values read from files batchtool reads (manifests, batch indexes) are checked before they are used."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlimit
from batchtool.core.errors import BatchtoolError, InputError
from batchtool.io.inputs import open_dataset
from batchtool.loader.load import load
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.core.synthetic import make_table
from conftest import REPO, write_parquet_shards

_CAP = 200 << 20


@pytest.fixture(scope="module")
def tfrecord_output(tmp_path_factory) -> str:
    """A small bucket output in TFRecord, whose manifest holds each file's batch index."""
    from click.testing import CliRunner

    from batchtool.cli import cli

    root = tmp_path_factory.mktemp("tfr")
    src = write_parquet_shards(str(root / "src"), make_table(60, seed=1), shards=1)
    result = CliRunner().invoke(cli, ["bucket", src, str(root / "out"), "--boundaries", "50", "--batch-size", "8",
                                      "--to", "tfrecord", "-q"])
    assert result.exit_code == 0, result.stderr
    return str(root / "out")


def _edit(dst: str, **entry: object) -> str:
    path = os.path.join(dst, MANIFEST_NAME)
    manifest = json.load(open(path))
    manifest["output"]["files"][0].update(entry)
    json.dump(manifest, open(path, "w"))
    return manifest["output"]["files"][0]["path"]


def test_a_batch_index_that_inflates_beyond_its_file_is_refused_before_inflating(tfrecord_output, tmp_path):
    """A manifest's zlib batch index of 256 MB of zeros (256 KB in the manifest), for as many batches as that
    holds: more batches than the file's bytes can frame, so it is refused before it is decompressed."""
    dst = tmp_path / "out"
    shutil.copytree(tfrecord_output, dst)
    squeeze = zlib.compressobj()
    bomb = b"".join([squeeze.compress(bytes(1 << 20)) for _ in range(256)] + [squeeze.flush()])
    name = _edit(str(dst), batch_index=base64.b64encode(bomb).decode(), batches=(256 << 20) // 16 - 1)
    run = memlimit.run_capped([sys.executable, "-c", f"import batchtool; batchtool.load({str(dst)!r})"], _CAP,
                              env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == 1 and run.peak_bytes < _CAP, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"batchtool.core.errors.InputError: {dst}/{name}: {MANIFEST_NAME} lists 16,777,215 batches, more than its "
        f"{os.path.getsize(dst / name):,} bytes can hold; the manifest is not this file's")


def test_a_batch_index_that_is_not_text_is_an_input_error(tfrecord_output, tmp_path):
    dst = tmp_path / "out"
    shutil.copytree(tfrecord_output, dst)
    _edit(str(dst), batch_index=12345)
    with pytest.raises(InputError, match="unreadable batch index"):
        load(str(dst))


@pytest.mark.parametrize("command, options", [
    (["segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "10", "--batch-size", "4"],
     {"world_size": "x"}),
    (["segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "10", "--batch-size", "4"],
     {"world_size": [2]}),
    (["bucket", "--boundaries", "20", "--batch-size", "4"], {"stages": "abc"}),
    (["bucket", "--boundaries", "20", "--batch-size", "4"], {"stages": [1, 2]}),
])
def test_inspect_shows_an_output_whose_manifest_options_are_odd(run_cli, tmp_path, command, options):
    """A manifest's options are free-form (only its counts, paths and schema are validated): what inspect takes
    from them for its summary is used only when it makes sense, never a traceback."""
    src = write_parquet_shards(str(tmp_path / "src"), make_table(40, seed=2), shards=1)
    assert run_cli(command[0], src, tmp_path / "out", *command[1:], "-q").exit_code == 0
    path = tmp_path / "out" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    if "stages" in options:
        manifest["command"] = "run"
    manifest["options"].update(options)
    path.write_text(json.dumps(manifest))
    result = run_cli("inspect", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "written by batchtool" in result.stdout


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(codec=st.sampled_from(["zstd", "snappy", "none"]), data=st.data())
def test_a_damaged_parquet_file_is_one_error_or_a_read(tmp_path_factory, codec, data):
    """Any few bytes changed (a footer's column name that is no longer UTF-8 was a UnicodeDecodeError traceback):
    reading either works or raises one BatchtoolError."""
    sink = io.BytesIO()
    pq.write_table(make_table(40, seed=1), sink, compression=codec, row_group_size=20)
    raw = bytearray(sink.getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("damaged") / "d.parquet"
    path.write_bytes(bytes(raw))
    try:
        for _ in open_dataset(str(path)).chunks():
            pass
    except BatchtoolError:
        pass


def test_a_column_name_that_is_not_utf8_is_one_error(tmp_path, run_cli):
    sink = io.BytesIO()
    pq.write_table(pa.table({"abcdef": [1, 2]}), sink, store_schema=False)
    (tmp_path / "bad.parquet").write_bytes(sink.getvalue().replace(b"abcdef", b"ab\xe4def"))
    result = run_cli("convert", tmp_path / "bad.parquet", tmp_path / "out")
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {tmp_path}/bad.parquet: not a readable "
                                                              "Parquet file"), result.stderr
