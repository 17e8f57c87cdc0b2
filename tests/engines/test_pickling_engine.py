"""The remote contract without Ray: an engine that pickles every function, item and result (as Ray does) runs
every operation and writes the bytes and statistics the local engine writes. A per-item function that changed
shared state, or returned its statistics by a side channel, would lose them here: each item gets its own copy."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import data_bytes, write_parquet_shards

from batchtool.core import runner
from batchtool.exec import distinct, engines, exchange
from batchtool.exec.engines import transport
from batchtool.exec.driver import _kernel, _numbered
from batchtool.pipeline import execute
from batchtool.ops.segment import chunks as segment_chunks
from batchtool.io.workspace import Workspace

from batchtool.exec.convert import convert
from batchtool.core.run_settings import RunSettings
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table

THREADS = runner.threaded_map
"""The local threads the fake engine runs on (a test may forbid everything else to use them)."""


class PicklingEngine:
    """Stands in for Ray (`--engine ray` gets it within `standing_in`): the function is pickled once, with the
    engines' own pickler (engines/transport.py), unpickled afresh for every item, and items and results go through it both
    ways; the work runs on the local threads, so ordering and backpressure are the local engine's."""

    name = "ray"

    def __init__(self, threads: int = 2) -> None:
        self.threads = threads
        self.items = 0
        """Items sent through pickle (to show the work really went this way)."""
        self.functions: list[Callable[[Any], Any]] = []
        """Every function mapped, in call order (to show which work went this way)."""

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int | None = None) -> Iterator[Any]:
        self.functions.append(fn)
        shipped = transport.pack(fn)

        def remote(item: Any) -> Any:
            return transport.pack(transport.unpack(shipped)(transport.unpack(item)))

        def sent(source: Iterable[Any]) -> Iterator[Any]:
            for item in source:
                self.items += 1
                yield transport.pack(item)

        for result in THREADS(remote, sent(items), self.threads, window):
            yield transport.unpack(result)

    @property
    def shares(self) -> runner.Shares:
        """Ray's: nothing but DST's storage."""
        return runner.Shares(memory=False, disk=False, tasks=self.threads, processes=True)

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@contextmanager
def standing_in(engine: PicklingEngine | None) -> Iterator[None]:
    """Within the block, a run with --engine ray runs on `engine` (with the run's --threads); None: as it would."""
    if engine is None:
        yield
        return
    original = engines.start

    def started(run: Any) -> Any:
        if run.engine != "ray":
            return original(run)
        engine.threads = run.threads
        return engine

    engines.start = started
    try:
        yield
    finally:
        engines.start = original


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """300 rows in 2 shards of 50-row row groups, with a boolean column for filter and --keep."""
    table = make_table(300, seed=7)
    table = table.append_column("keep", pa.array(np.arange(300) % 5 != 0))
    return write_parquet_shards(str(tmp_path_factory.mktemp("src")), table)


SEGMENT = ("--key", "key", "--sequence", "tokens,frames", "--context", "label", "--num-unroll", "4",
           "--batch-size", "8")
COMMANDS = {
    "filter": ("filter", "--column", "keep"),
    "select": ("select", "--columns", "tokens,key"),
    "rename": ("rename", "--columns", "label=class"),
    "stratify-exact": ("stratify", "--target", "uniform", "--seed", "3"),
    "stratify-online": ("stratify", "--target", "uniform", "--mode", "online", "--num-classes", "4"),
    "stratify-balanced": ("stratify", "--target", "uniform", "--batch-size", "8", "--balanced-batches"),
    "resample-rate": ("resample", "--rate", "2.5", "--seed", "1"),
    "resample-weighted": ("resample", "--weight", "weight", "--overall-rate", "1.5"),
    "resample-running-mean": ("resample", "--weight", "weight", "--overall-rate", "1", "--running-mean"),
    "shuffle": ("shuffle", "--memory", "20KB", "--batch-size", "32"),
    "shuffle-buffered": ("shuffle", "--buffer", "64", "--min-after-dequeue", "16"),
    "bucket": ("bucket", "--boundaries", "10,20,40", "--batch-size", "8", "--keep", "keep"),
    "bucket-balance": ("bucket", "--auto-buckets", "2", "--batch-size", "8", "--balance", "label"),
    "pack": ("pack", "--max-length", "512", "--sequence", "tokens", "--batch-size", "4"),
    "segment": ("segment", *SEGMENT),
    "segment-tfrecord-out": ("segment", *SEGMENT, "--to", "tfrecord", "--allow-small-batch"),
}

PIPELINE = """seed = 5
memory = "64KB"
[input]
path = "{src}"
[[stage]]
op = "filter"
column = "keep"
[[stage]]
op = "stratify"
target = "uniform"
replacement = true
[[stage]]
op = "rename"
columns = {{ tokens = "ids" }}
[[stage]]
op = "shuffle"
[[stage]]
op = "bucket"
length = "ids"
boundaries = "12,30"
batch-size = 16
[output]
path = "{dst}"
"""


def manifest(dst: str) -> dict:
    with open(os.path.join(dst, MANIFEST_NAME)) as f:
        return json.load(f)


def run_both(run_cli, tmp_path, args: Callable[[str], list[str]], monkeypatch=None) -> PicklingEngine:
    """Run on the local engine and on the pickling one; the data files, output and statistics must agree. With
    `monkeypatch`, the pickled run may use no local threads but the fake engine's (no work falls back to them)."""
    assert run_cli(*args(str(tmp_path / "local")), "--threads", "2", "-q").exit_code == 0
    engine = PicklingEngine()
    if monkeypatch is not None:
        monkeypatch.setattr(runner, "threaded_map", fell_back)
    with standing_in(engine):
        result = run_cli(*args(str(tmp_path / "pickled")), "--threads", "2", "-q", "--engine", "ray")
    assert result.exit_code == 0, result.stderr
    assert data_bytes(str(tmp_path / "pickled")) == data_bytes(str(tmp_path / "local"))
    local, pickled = manifest(str(tmp_path / "local")), manifest(str(tmp_path / "pickled"))
    assert local["stats"] == pickled["stats"] and local["output"] == pickled["output"]
    return engine


def fails_alike(run_cli, tmp_path, args: list[str]) -> tuple[PicklingEngine, str]:
    """The command fails on the pickling engine as on the local one: exit 2, the same one line, an existing DST
    (replaced with --overwrite) untouched, nothing left beside it. The engine and the line."""
    results, engine = {}, PicklingEngine()
    for name, used in (("local", None), ("ours", engine)):
        dst = tmp_path / "out" / name
        dst.mkdir(parents=True)
        (dst / "kept").write_text("mine")
        with standing_in(used):
            results[name] = run_cli(*args, dst, "--overwrite", "-q", *(["--engine", "ray"] if used else []))
        assert os.listdir(dst) == ["kept"] and (dst / "kept").read_text() == "mine"
    local, ours = results["local"], results["ours"]
    assert (ours.exit_code, ours.stderr.replace("/ours", "/local")) == (local.exit_code, local.stderr)
    assert ours.exit_code == 2 and ours.stderr.startswith("error: ") and ours.stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path / "out")) == ["local", "ours"]  # no .DST.tmp-* left
    return engine, ours.stderr


def pipeline(tmp_path, text: str, **values: str) -> Callable[[str], list[str]]:
    """run_both's args for a pipeline: its file written beside DST (as local.toml, pickled.toml), `text` filled
    with `values` and the output path."""
    def args(dst: str) -> list[str]:
        path = tmp_path / f"{os.path.basename(dst)}.toml"
        path.write_text(text.format(dst=dst, **values))
        return ["run", str(path)]
    return args


def fell_back(fn: Callable[[Any], Any], *args: Any) -> Iterator[Any]:
    raise AssertionError(f"{getattr(fn, '__qualname__', fn)} ran on local threads instead of the engine")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_op_writes_the_same_through_pickles(name, src, tmp_path, run_cli):
    command, *options = COMMANDS[name]
    engine = run_both(run_cli, tmp_path, lambda dst: [command, src, dst, *options])
    assert engine.items, "no work went through the engine"


def test_a_pipeline_writes_the_same_through_pickles(src, tmp_path, run_cli):
    args = pipeline(tmp_path, PIPELINE, src=src)
    assert run_both(run_cli, tmp_path, args).items


AFTER_SHUFFLE = """seed = 5
memory = "64KB"
[input]
path = "{src}"
[[stage]]
op = "stratify"
target = "uniform"
replacement = true
[[stage]]
op = "shuffle"
[[stage]]
op = "resample"
rate = 2.5
[[stage]]
op = "rename"
columns = {{ tokens = "ids" }}
[[stage]]
op = "bucket"
length = "ids"
boundaries = "12,30"
batch-size = 16
[output]
path = "{dst}"
"""


def test_stages_after_a_pipeline_shuffle_run_on_the_engine(src, tmp_path, run_cli, monkeypatch):
    """A global shuffle in the middle: scattered and sorted through files beside DST; the stage after it reads its
    batches from them in its own tasks; the kernels of the row stages after it go through the engine, pickled,
    and the last stage (bucket) scatters, sorts and writes its batches there too; nothing falls back to local
    threads; the same bytes, and no temporary files left beside DST."""
    args = pipeline(tmp_path, AFTER_SHUFFLE, src=src)
    read = []
    original = execute._SortedBatch.__call__
    monkeypatch.setattr(execute._SortedBatch, "__call__", lambda task: read.append(task.index) or original(task))
    engine = run_both(run_cli, tmp_path, args, monkeypatch)
    assert read and set(read) == set(range(max(read) + 1)), "the stage after the shuffle did not read its sorted files"
    assert sorted(os.listdir(tmp_path)) == ["local", "local.toml", "pickled", "pickled.toml"]
    kernels = [fn.args[0].name for fn in engine.functions if isinstance(fn, functools.partial) and fn.func is _kernel]
    assert {"stratify", "resample", "rename"} <= set(kernels), kernels
    last = {getattr(fn, "func", fn).__name__ for fn in engine.functions}  # bucket scattered and written there
    assert {"_map", "_sort_part", "_bucket_cut"} <= last and last & {"_write_shard"}, last


FIRST_SHUFFLE = """seed = 5
memory = "64KB"
[input]
path = "{src}"
[[stage]]
op = "shuffle"
[[stage]]
op = "resample"
rate = 2.5
[output]
path = "{dst}"
"""


def test_a_pipeline_shuffle_failing_in_a_map_task_leaves_nothing(src, tmp_path, run_cli):
    """A corrupt record met while the shuffle's rows are scattered beside the output: the local engine's one
    error line, exit 2, and nothing left beside the output."""
    tfr = tmp_path / "tfr"
    convert(src, str(tfr), OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)),
            run=RunSettings(quiet=True))
    raw = bytearray((tfr / "part-00001.tfrecord").read_bytes())
    raw[200] ^= 0xFF
    (tfr / "part-00001.tfrecord").write_bytes(bytes(raw))
    out = tmp_path / "out"
    out.mkdir()
    errors = {}
    engine_used = PicklingEngine()
    for engine in ("local", "pickled"):
        pipeline = tmp_path / f"{engine}.toml"
        pipeline.write_text(FIRST_SHUFFLE.format(src=tfr, dst=out / engine))
        with standing_in(engine_used if engine == "pickled" else None):
            result = run_cli("run", pipeline, "-q", *(["--engine", "ray"] if engine == "pickled" else []))
        assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        errors[engine] = result.stderr.replace(str(tmp_path / "pickled.toml"), str(tmp_path / "local.toml"))
    assert errors["pickled"] == errors["local"] and "part-00001.tfrecord" in errors["local"]
    assert os.listdir(out) == []
    assert any(isinstance(fn, functools.partial) and fn.func is exchange._map for fn in engine_used.functions)


def ran(fn: Callable) -> Callable:
    """The function a task the engine ran calls: a partial's, or the op's own that a runtime's map_rows numbers."""
    while isinstance(fn, functools.partial):
        fn = fn.args[0] if fn.func is _numbered else fn.func
    return fn


def test_segment_keys_stay_beside_the_output(src, tmp_path, run_cli):
    """segment through pickles: each chunk's task writes its key hashes beside DST and one task per partition
    finds the repeats; no hash comes back with the examples; the same bytes, and nothing left beside DST."""
    engine = run_both(run_cli, tmp_path, lambda dst: ["segment", src, dst, *SEGMENT])
    used = set(map(ran, engine.functions))
    assert {segment_chunks.prepare_shared, distinct._candidates} <= used
    assert segment_chunks.prepare_chunk not in used
    assert sorted(os.listdir(tmp_path)) == ["local", "pickled"]


def repeated_keys_src(directory: str) -> str:
    """300 rows in 2 shards whose keys repeat across chunks and shards, the first repeat by id not the first
    in hash order (tests/engines/test_ray.py uses it too)."""
    table = make_table(300, seed=7)
    keys = table.column("key").to_pylist()
    for later, first in ((250, 10), (120, 60), (299, 0), (200, 199)):
        keys[later] = keys[first]
    return write_parquet_shards(directory, table.set_column(0, "key", pa.array(keys)))


def test_a_duplicate_segment_key_fails_as_on_the_local_engine(tmp_path, run_cli):
    """Keys repeated across chunks and shards: the local engine's one error line (the first duplicate by id,
    confirmed), exit 2, DST untouched and no temporary directory left beside it."""
    src = repeated_keys_src(str(tmp_path / "src"))
    out = tmp_path / "out"
    out.mkdir()
    errors = {}
    for name, engine in (("local", None), ("pickled", PicklingEngine())):
        dst = out / name
        dst.mkdir()
        (dst / "kept").write_text("mine")
        with standing_in(engine):
            result = run_cli("segment", src, dst, *SEGMENT, "--overwrite", "-q",
                             *(["--engine", "ray"] if engine else []))
        assert result.exit_code == 2 and result.stderr.startswith("error: duplicate key ")
        assert result.stderr.count("\n") == 1
        assert os.listdir(dst) == ["kept"] and (dst / "kept").read_text() == "mine"
        errors[name] = result.stderr
    assert errors["pickled"] == errors["local"]
    assert sorted(os.listdir(out)) == ["local", "pickled"]
    assert segment_chunks.prepare_shared in map(ran, engine.functions)


def test_key_pairs_find_the_same_repeats_through_pickles(tmp_path):
    """Written chunk by chunk (one chunk twice, as a retried task writes it) and searched a partition per task
    (a one-byte budget), pickled: the same repeats by id as in one task on the driver."""
    gen = np.random.default_rng(3)
    hashes = gen.integers(0, 2**64, 900, dtype=np.uint64)
    hashes[[5, 400, 401, 899]] = hashes[2]
    hashes[[700, 30]] = hashes[600]
    ids = np.arange(900, dtype=np.uint64)
    space = Workspace(str(tmp_path), "out", shared=True)  # beside DST: the engine's workers search it
    spread, whole = (distinct.key_pairs(space, budget) for budget in (1, 1 << 30))
    for k, start in enumerate(range(0, 900, 250)):
        for pairs in (spread, whole):
            pairs.write(k, hashes[start:start + 250], ids[start:start + 250])
    spread.write(1, hashes[250:500], ids[250:500])
    engine = PicklingEngine()
    found, expected = spread.candidates(engine, 4), whole.candidates(runner.SERIAL, 4)
    assert (found.count, found.ids.tolist(), found.first_ids.tolist()) == (6, [5, 400, 401, 600], [2, 2, 2, 30])
    assert (expected.count, expected.ids.tolist(), expected.first_ids.tolist()) == (6, [5, 400, 401, 600], [2, 2, 2, 30])
    assert sum(isinstance(fn, functools.partial) and fn.func is distinct._candidates for fn in engine.functions) == 1


SEGMENT_LAST = """seed = 5
[input]
path = "{src}"
[[stage]]
op = "filter"
column = "keep"
[[stage]]
op = "segment"
key = "key"
sequence = "tokens"
num-unroll = 4
batch-size = 8
[output]
path = "{dst}"
"""


def test_a_pipeline_ending_in_segment_checks_its_keys_beside_the_output(src, tmp_path, run_cli):
    """A pipeline's last stage: its key hashes written and reduced beside the output too; the same bytes."""
    args = pipeline(tmp_path, SEGMENT_LAST, src=src)
    engine = run_both(run_cli, tmp_path, args)
    used = set(map(ran, engine.functions))
    assert {segment_chunks.prepare_shared, distinct._candidates} <= used
    assert sorted(os.listdir(tmp_path)) == ["local", "local.toml", "pickled", "pickled.toml"]


def test_a_value_tfrecord_cannot_hold_names_its_file_and_row_from_the_workers_too(run_cli, tmp_path):
    """convert checks each chunk where it is read (a spool task); shuffle finds the row in the input after its
    exchange's writer refused it: either way the line names the input file and row, as on the local engine."""
    tokens = [[i] for i in range(300)]
    tokens[242] = [1, None]
    write_parquet_shards(str(tmp_path / "src"), pa.table({"tokens": tokens}), shards=1, row_group_size=100)
    src = str(tmp_path / "src")
    for command in ("convert", "shuffle"):
        _, line = fails_alike(run_cli, tmp_path / command, [command, src, "--to", "tfrecord"])
        assert line.startswith(f"error: {src}/part-00000.parquet, row 242, column 'tokens': a value inside a list "
                               "is null"), line
