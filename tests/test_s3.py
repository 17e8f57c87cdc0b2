"""Object-store URIs (s3://) for input and output, against a moto S3 server the test starts on loopback."""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from conftest import SAMPLE, read_dir

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
