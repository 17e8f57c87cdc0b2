"""Adding an engine, as docs/internals.md ("Adding an engine") says: one class, one line in ENGINES; the run then
follows what the class declares it shares (runner.Shares), and an engine's module is imported only when chosen."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from conftest import data_bytes, write_parquet_shards

from batchtool.core import run_settings
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Shares, threaded_map
from batchtool.core.synthetic import make_table
from batchtool.exec.convert import convert
from batchtool.exec.driver import run_operation
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.io.output import OutputOptions
from batchtool.ops.shuffle import OP, ShuffleOptions


class Spooling:
    """Step 1: the executor class. Threads that declare the driver's disk but not its memory, so the run takes the
    road of worker processes (tasks spool and write the shards, exchanges spill) without starting any."""

    name = "spooling"
    mapped: list[Callable[[Any], Any]] = []
    """Every function mapped by any instance (to show the work went this way)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    @classmethod
    def start(cls, run: RunSettings) -> Spooling:
        return cls(run.threads)

    @property
    def shares(self) -> Shares:
        return Shares(memory=False, disk=True, tasks=self.threads, processes=True)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int | None = None) -> Iterator[Any]:
        self.mapped.append(fn)
        return threaded_map(fn, items, self.threads, window)

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@pytest.fixture
def registered(monkeypatch) -> list[Callable[[Any], Any]]:
    """Step 2: its line in ENGINES."""
    monkeypatch.setitem(run_settings.ENGINES, "spooling", f"{__name__}:Spooling")
    Spooling.mapped.clear()
    return Spooling.mapped


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    return write_parquet_shards(str(tmp_path_factory.mktemp("src")), make_table(300, seed=7))


def _names(mapped: list[Callable[[Any], Any]]) -> set[str]:
    return {getattr(getattr(fn, "func", fn), "__name__", "") for fn in mapped}


@pytest.mark.parametrize("shard_bytes", [None, 20_000])
def test_a_registered_engine_writes_the_local_bytes_on_its_declared_road(src, tmp_path, registered, shard_bytes):
    """Step 3: the local engine's bytes; and the road its Shares declare: a stream spooled and every shard written
    by its tasks (measured first when --shard-bytes cuts them), an exchange's cells spilled to --tmp-dir."""
    output = OutputOptions(shard_bytes=shard_bytes)
    for engine in ("local", "spooling"):
        run = RunSettings(threads=2, quiet=True, engine=engine, memory=30_000, tmp_dir=str(tmp_path))
        convert(src, str(tmp_path / f"convert-{engine}"), output, run=run)
        run_operation(OP, ShuffleOptions(batch_size=16), src, str(tmp_path / f"shuffle-{engine}"), output, run, seed=3)
    for command in ("convert", "shuffle"):
        local = data_bytes(str(tmp_path / f"{command}-local"))
        assert data_bytes(str(tmp_path / f"{command}-spooling")) == local and len(local) > (shard_bytes is not None)
    assert {"_spool", "_write_shard", "_map"} <= _names(registered)
    assert ("_measure" in _names(registered)) == (shard_bytes is not None)


def test_the_manifest_names_the_engine(src, tmp_path, registered):
    dst = str(tmp_path / "out")
    convert(src, dst, OutputOptions(), run=RunSettings(quiet=True, engine="spooling"))
    with open(os.path.join(dst, MANIFEST_NAME)) as f:
        assert json.load(f)["run"]["engine"] == "spooling"


IMPORTED = """
import sys
from batchtool.core.run_settings import RunSettings
from batchtool.exec.engines import executor
with executor(RunSettings(engine=sys.argv[1], threads=1)) as ran:
    assert list(ran.map(abs, [-1, 2])) == [1, 2]
print(sorted(m for m in ("batchtool.exec.engines.processes", "batchtool.exec.engines.ray", "ray") if m in sys.modules))
"""


@pytest.mark.parametrize("engine,imported", [("local", []), ("processes", ["batchtool.exec.engines.processes"])])
def test_an_engine_module_is_imported_only_when_chosen(engine, imported):
    out = subprocess.run([sys.executable, "-c", IMPORTED, engine], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(imported)


@pytest.mark.parametrize("command", ["convert", "shuffle"])
def test_the_process_engine_fails_as_the_local_one(command, tmp_path, run_cli):
    """A value TFRecord cannot hold, found in a worker process: the local engine's one line naming the file and row,
    exit 2, nothing left beside DST."""
    tokens = [[i] for i in range(300)]
    tokens[242] = [1, None]
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"tokens": tokens}), shards=1, row_group_size=100)
    lines = {}
    for engine in ("local", "processes"):
        result = run_cli(command, src, tmp_path / "out" / engine, "--to", "tfrecord", "-q", "--threads", "2",
                         "--engine", engine)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
        lines[engine] = result.stderr.replace("/processes", "/local")
    assert lines["processes"] == lines["local"]
    assert lines["local"].startswith(f"error: {src}/part-00000.parquet, row 242, column 'tokens': ")
    assert not os.path.exists(tmp_path / "out")


def test_no_engine_is_a_case_outside_the_engines_package():
    """Every engine-dependent strategy follows from what the executor declares (runner.Shares): nothing outside
    exec/engines/ asks whether it is remote, nor which engine it is."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(run_settings.__file__)))
    asked = re.compile(r"\.remote\b|\.name\s*==\s*[\"'](local|processes|ray)[\"']|engine\s*==\s*[\"']")
    found = [f"{os.path.relpath(path, package)}:{number}: {line.strip()}"
             for folder, _, names in os.walk(package) if os.sep + os.path.join("exec", "engines") not in folder
             for path in (os.path.join(folder, name) for name in names if name.endswith(".py"))
             for number, line in enumerate(open(path, encoding="utf-8"), 1) if asked.search(line)]
    assert not found, found
