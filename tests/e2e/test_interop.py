"""Other tools read a batchtool Parquet output directory as a dataset: the manifest beside the shards must not trip them.

Each reader is an optional test dependency (the `test` extra installs them); a test is skipped
where its reader is not installed.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from conftest import read_dir, write_parquet_shards

from batchtool.io.example_index import INDEX_NAME
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.core.synthetic import make_table


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory) -> str:
    """A Parquet bucket output of 60 rows in three shards (so shard order shows), with its manifest."""
    from batchtool.cli import cli
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("interop")
    src = write_parquet_shards(str(root / "src"), make_table(60, seed=3))
    dst = str(root / "dst")
    result = CliRunner().invoke(cli, ["bucket", src, dst, "--boundaries", "20,40", "--batch-size", "8",
                                      "--shard-rows", "24", "--to", "parquet", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert sorted(os.listdir(dst)) == [INDEX_NAME, MANIFEST_NAME, "part-00000.parquet", "part-00001.parquet",
                                       "part-00002.parquet"]
    return dst


@pytest.fixture(scope="module")
def expected(bucketed) -> list[dict]:
    return read_dir(bucketed).to_pylist()


def rows(table: pa.Table) -> list[dict]:
    """Rows as Python values, whatever Arrow types (large_string, large_list, views) a reader chose."""
    return table.to_pylist()


def test_pyarrow_read_table(bucketed, expected):
    assert rows(pq.read_table(bucketed)) == expected


def test_pyarrow_dataset(bucketed, expected):
    assert rows(pads.dataset(bucketed, format="parquet").to_table()) == expected


def test_pandas_read_parquet(bucketed, expected):
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(bucketed)
    assert rows(pa.Table.from_pandas(frame, preserve_index=False)) == expected


def test_polars_read_parquet_glob(bucketed, expected):
    pl = pytest.importorskip("polars")
    assert rows(pl.read_parquet(os.path.join(bucketed, "*.parquet")).to_arrow()) == expected


def test_duckdb_read_parquet_glob(bucketed, expected):
    duckdb = pytest.importorskip("duckdb")
    with duckdb.connect() as con:
        table = con.sql(f"SELECT * FROM read_parquet('{bucketed}/*.parquet')").to_arrow_table()
    assert rows(table) == expected


def test_huggingface_datasets_data_dir(bucketed, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    train = datasets.load_dataset("parquet", data_dir=bucketed, cache_dir=str(tmp_path / "hf"))["train"]
    assert rows(train.data.table) == expected


def test_the_legacy_name_is_what_broke_them(bucketed, tmp_path):
    """Why the manifest starts with a dot: under batchtool 0.1's name, pyarrow fails on the directory."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in os.listdir(bucketed):
        target = "manifest.json" if name == MANIFEST_NAME else name
        (legacy / target).write_bytes(open(os.path.join(bucketed, name), "rb").read())
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(str(legacy))
