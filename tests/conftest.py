"""Shared fixtures: tiny seeded datasets written to tmp dirs, and a CLI runner that keeps stderr apart."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import settings

from batchtool.cli import cli
from batchtool.core.synthetic import make_table

# On CI every property test draws the same examples each run (a failure there is the code's, never the draw's);
# elsewhere each run draws afresh, so running the suite keeps exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "sample_data")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """pytest-xdist (`--dist loadgroup`, pyproject's addopts) sends each test module to one worker, so a module's
    expensive fixtures (a Ray cluster, capped children's runs) start once; the modules marked
    `xdist_group("ray")` share a worker, since `ray.init()` joins whatever cluster `ray start` last started on
    the machine. Before xdist's own hook reads the marks."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))


def write_parquet_shards(directory: str, table: pa.Table, shards: int = 2, row_group_size: int = 50) -> str:
    """Split a table into `shards` Parquet files of several row groups each."""
    os.makedirs(directory, exist_ok=True)
    per = -(-table.num_rows // shards)
    for i in range(shards):
        pq.write_table(table.slice(i * per, per), os.path.join(directory, f"part-{i:05d}.parquet"),
                       row_group_size=row_group_size)
    return directory


@pytest.fixture
def corpus(tmp_path) -> pa.Table:
    return make_table(300, seed=7)


@pytest.fixture
def parquet_src(tmp_path, corpus) -> str:
    return write_parquet_shards(str(tmp_path / "src"), corpus)


def invoke_cli(*args: object):
    """Invoke the CLI in-process; returns click's Result with stdout and stderr separate."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def run_cli():
    """invoke_cli, for a test (a module-scoped fixture calls invoke_cli itself)."""
    return invoke_cli


def read_dir(path: str) -> pa.Table:
    """All part files of a Parquet or Arrow IPC output directory, in order, as pyarrow (not batchtool) reads them:
    tests of an operation's rows read its output whatever format the command wrote by default."""
    files = sorted(f for f in os.listdir(path) if f.startswith("part-") and f.endswith((".parquet", ".arrow")))
    assert files, f"no Parquet or Arrow IPC part files in {path}"
    return pa.concat_tables([read_part(os.path.join(path, f)) for f in files])


def read_part(path: str) -> pa.Table:
    """One Parquet or Arrow IPC part file, read by pyarrow."""
    if path.endswith(".arrow"):
        with pa.OSFile(path) as f:
            return pa.ipc.open_file(f).read_all()
    return pq.read_table(path)


def data_bytes(path: str) -> dict[str, bytes]:
    """The bytes of every data file of an output directory (the manifest's run section may differ)."""
    return {f: open(os.path.join(path, f), "rb").read() for f in sorted(os.listdir(path)) if f.startswith("part-")}


@pytest.fixture(scope="module")
def datasets():
    """Hugging Face `datasets`, offline and quiet (skipped where it is not installed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        yield pytest.importorskip("datasets")
