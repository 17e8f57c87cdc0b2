"""Object-store URIs (s3://) for input and output, against a moto S3 server the test starts on loopback."""

from __future__ import annotations

import json
import os
import re

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from conftest import SAMPLE, read_dir
from load_outputs import BUCKET_BATCHES, bucket_output

import batchtool
from batchtool.core.errors import InputError

moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A fresh S3 server on 127.0.0.1 with bucket `data` holding sample_data/parquet; stopped afterwards."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                            "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_EC2_METADATA_DISABLED="true")
    fs = pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", access_key="test",
                           secret_key="test", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("data")
    pafs.copy_files(os.path.join(SAMPLE, "parquet"), "data/parquet", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    yield fs
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_inspect_reads_s3(s3, run_cli):
    result = run_cli("inspect", "s3://data/parquet", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.output)
    assert data["rows"] == 4000 and len(data["shards"]) == 4
    assert data["shards"][0]["path"] == "s3://data/parquet/part-00000.parquet"


def test_convert_s3_to_s3_and_back(s3, run_cli, tmp_path):
    result = run_cli("convert", "s3://data/parquet", "s3://data/out", "--to", "tfrecord", "--shard-rows", 1500, "-q")
    assert result.exit_code == 0, result.stderr
    names = sorted(info.base_name for info in s3.get_file_info(pafs.FileSelector("data/out")))
    assert names == [".batchtool_manifest.json", "part-00000.tfrecord", "part-00001.tfrecord"]
    result = run_cli("convert", "s3://data/out", "s3://data/out", "-q")
    assert result.exit_code == 2 and "s3://data/out is the input s3://data/out;" in result.stderr
    result = run_cli("convert", "s3://data/parquet", "s3://data/out", "-q")
    assert result.exit_code == 2 and "destination exists" in result.stderr
    assert run_cli("convert", "s3://data/out/*.tfrecord", tmp_path / "local", "-q").exit_code == 0
    want = pq.read_table(os.path.join(SAMPLE, "parquet"))
    got = read_dir(str(tmp_path / "local"))
    assert got.select(want.column_names).equals(want.select(want.column_names))


def test_missing_s3_input_is_a_clean_error(s3, run_cli, tmp_path):
    result = run_cli("inspect", "s3://data/nothing-here")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: s3://data/nothing-here: no such file or directory")


def _upload(s3, local: str, key: str) -> str:
    pafs.copy_files(local, f"data/{key}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=s3)
    return f"s3://data/{key}"


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_load_reads_an_s3_output(s3, tmp_path, fmt):
    """The loader gives the same batches from s3:// as from the same output on disk (both layouts)."""
    local = bucket_output(str(tmp_path), fmt)
    uri = _upload(s3, local, f"load-{fmt}")
    want = list(batchtool.load(local, shuffle=False).record_batches())
    got = list(batchtool.load(uri, shuffle=False).record_batches())
    assert len(got) == len(want) == BUCKET_BATCHES and all(a.equals(b) for a, b in zip(got, want))
    s3.delete_file(f"data/load-{fmt}/part-00000.{fmt}")
    with pytest.raises(InputError, match=rf"^s3://data/load-{fmt}/part-00000.{fmt}: listed in .* but missing"):
        batchtool.load(uri)


def test_check_checksums_of_an_s3_output(s3, tmp_path, run_cli):
    """check --checksums hashes the files in the object store: a match, then one changed file named."""
    uri = _upload(s3, bucket_output(str(tmp_path)), "checksums")
    result = run_cli("check", uri, "--checksums")
    assert result.exit_code == 0, result.stderr
    assert re.search(r"^checksums +PASS +all 3 files match", result.output, re.M), result.output
    key = "data/checksums/part-00001.parquet"
    with s3.open_input_file(key) as f:
        damaged = bytearray(f.read())
    damaged[100] ^= 0xFF  # the same size: only the sha256 over the object's bytes can tell
    with s3.open_output_stream(key) as out:
        out.write(bytes(damaged))
    result = run_cli("check", uri, "--checksums", "--max-offenders", "5")
    assert result.exit_code == 1
    assert re.search(r"^checksums +FAIL +1 of 3 files differ", result.output, re.M), result.output
    assert f"s3://{key}" in result.output and "changed: sha256" in result.output, result.output


def test_where_and_step_read_an_s3_output_as_its_local_copy(s3, tmp_path, run_cli):
    """The example index is read through the object store as the batches are: the same answers as on disk."""
    local = bucket_output(str(tmp_path))
    uri = _upload(s3, local, "receipts")
    for args in (["step", "{dst}", "3"], ["where", "{dst}", "ex-00000017", "--world-size", "2"]):
        answers = [run_cli(*[a.format(dst=dst) for a in args]) for dst in (local, uri)]
        assert answers[0].exit_code == answers[1].exit_code == 0, answers[1].stderr
        assert answers[0].output == answers[1].output.replace(uri, local) and answers[0].output.strip()
