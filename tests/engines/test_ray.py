"""--engine ray: the same output as the local engine for every operation, on one local 2-CPU Ray cluster.

Every test marked `ray` shares the cluster the `ray_cluster` fixture starts once for this module
(and shuts down after it); they are skipped where `import ray` fails. The local S3 server is
started before the cluster, so its endpoint is in the environment the Ray workers inherit.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from memlimit import HANG_GUARD

import batchtool.exec.engines.ray as ray_engine
from batchtool.core import runner
from batchtool.check.evaluate import check
from batchtool.exec.convert import convert
from batchtool.core.errors import InputError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import _kernel, run_operation
from batchtool.exec import exchange
from batchtool.ops.shuffle import OP as SHUFFLE
from batchtool.ops.shuffle import ShuffleOptions
from batchtool.ops import stratify as stratify_op
from batchtool.ops.stratify import LabelError, StratifyOptions
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table
from conftest import data_bytes, write_parquet_shards
from parked_cli import start_parked
from test_s3 import s3  # noqa: F401 (the local S3 server: bucket `data`, shared with test_s3.py's keys)

RAY = pytest.mark.ray
pytestmark = pytest.mark.xdist_group("ray")  # with test_ray_multinode.py: one Ray runtime at a time (conftest)


@pytest.fixture(scope="module")
def ray_cluster(request):
    """One local Ray cluster (2 CPUs) for every Ray test of this module. Its workers import batchtool from
    this source tree and can import the test modules (functions defined here are pickled by reference)."""
    ray = pytest.importorskip("ray")
    request.getfixturevalue("s3")  # first: the workers inherit its endpoint
    saved = os.environ.get("PYTHONPATH")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = [os.path.join(tests, name) for name in os.listdir(tests)  # every layer's tests, as pytest's pythonpath
               if os.path.isdir(os.path.join(tests, name)) and name not in ("data", "__pycache__")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, *sorted(folders), os.path.dirname(tests), saved]))
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    yield ray
    ray.shutdown()


@pytest.fixture
def remote_maps(ray_cluster, monkeypatch):
    """Counts RayEngine.map calls, to show a command really ran its work on Ray."""
    calls = []
    original = ray_engine.RayEngine.map

    def counting(self, fn, items, window=None):
        calls.append(fn)
        return original(self, fn, items, window)

    monkeypatch.setattr(ray_engine.RayEngine, "map", counting)
    return calls


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """300 rows in 2 shards of 50-row row groups (12 read tasks), with a boolean column for --keep."""
    table = make_table(300, seed=7)
    table = table.append_column("keep", pa.array(np.arange(300) % 5 != 0))
    return write_parquet_shards(str(tmp_path_factory.mktemp("src")), table)


# -- the engine itself ----------------------------------------------------------------------------------------


class Failing(InputError):
    """An error whose constructor does not take its message (as stratify's LabelError)."""

    def __init__(self, row: int) -> None:
        self.row = row
        super().__init__(f"row {row} is bad")


def fail_at(k: int):
    def fn(x: int) -> int:
        if x == k:
            raise Failing(x)
        return x
    return fn


def square_slowly(x: int) -> tuple[int, int]:
    """5 ms of work per item: more than shipping it costs, so the engine keeps the function remote."""
    end = time.perf_counter() + 0.005
    while time.perf_counter() < end:
        pass
    return x * x, os.getpid()


@RAY
def test_map_runs_remotely_in_input_order(ray_cluster):
    engine = ray_engine.RayEngine()
    out = list(engine.map(square_slowly, range(40)))
    assert [v for v, _ in out] == [x * x for x in range(40)]
    assert os.getpid() not in {pid for _, pid in out}
    engine.close()
    assert ray_cluster.is_initialized()  # a joined session is left running


def _outcome(seconds: float) -> ray_engine._Outcome:
    return ray_engine._Outcome(results=[], error=None, seconds=seconds, node="node")


@pytest.mark.parametrize("worker, transfer, local", [(0.001, 0.002, True), (0.002, 0.001, False)])
def test_the_schedule_keeps_a_function_on_the_driver_once_shipping_it_costs_more(worker, transfer, local):
    """The decision alone, from given timings: it waits for LOCAL_PROBE_ITEMS items, then compares the workers'
    time for them with the driver's time packing and unpacking them."""
    schedule = ray_engine._Schedule()
    seen = []
    for _ in range(ray_engine.LOCAL_PROBE_ITEMS):
        schedule.sent(ray_engine._pack([0]), 1, transfer / 2)
        schedule.received(_outcome(worker), 1, transfer / 2)
        seen.append(schedule.local)
    assert seen == [False] * (ray_engine.LOCAL_PROBE_ITEMS - 1) + [local]


class _FreeOnWorkers(ray_engine._Schedule):
    """A schedule that sees every item take no time on a worker, whatever the machine's load did to the
    measurement: the map's switch to the driver, without timing luck."""

    def received(self, outcome, items, seconds):
        super().received(ray_engine._Outcome(outcome.results, outcome.error, 0.0, outcome.node), items, seconds)


@RAY
def test_a_function_too_cheap_to_ship_finishes_on_the_driver(ray_cluster, monkeypatch):
    monkeypatch.setattr(ray_engine, "_Schedule", _FreeOnWorkers)
    engine = ray_engine.RayEngine()
    out = list(engine.map(lambda x: (x + 1, os.getpid()), range(5000), 2))
    assert [v for v, _ in out] == list(range(1, 5001))
    pids = [pid for _, pid in out]
    assert pids[0] != os.getpid() and pids[-1] == os.getpid()
    assert 0 < engine.timings.local_items < 5000


@RAY
def test_errors_come_back_in_order_as_the_same_type(ray_cluster):
    seen = []
    with pytest.raises(Failing, match="row 7 is bad") as info:
        for value in ray_engine.RayEngine().map(fail_at(7), range(20), window=4):
            seen.append(value)
    assert seen == list(range(7)) and info.value.row == 7
    assert "in a Ray task" in str(info.value.__cause__)


@RAY
def test_source_error_follows_the_results_before_it(ray_cluster):
    def items():
        yield from range(5)
        raise UsageError("source broke")

    seen = []
    with pytest.raises(UsageError, match="source broke"):
        for value in ray_engine.RayEngine().map(lambda x: x + 1, items()):
            seen.append(value)
    assert seen == [1, 2, 3, 4, 5]


@RAY
def test_a_function_that_cannot_be_pickled_runs_locally(ray_cluster, capsys):
    held = (x for x in range(3))  # generators do not pickle

    def fn(x: int) -> tuple[int, int]:
        return x + 1, id(held)

    out = list(ray_engine.RayEngine().map(fn, range(10), 2))
    assert [v for v, _ in out] == list(range(1, 11))
    assert capsys.readouterr().err == ("warning: --engine ray: test_a_function_that_cannot_be_pickled_runs_locally."
                                       "<locals>.fn cannot be sent to Ray workers (cannot pickle 'generator' object);"
                                       " it runs on local threads\n")


@RAY
def test_library_call_runs_on_the_engine_in_run_settings(src, tmp_path, remote_maps):
    options = StratifyOptions(mode="bernoulli")
    ray = stratify(src, str(tmp_path / "ray"), options, OutputOptions(),
                   RunSettings(threads=2, quiet=True, engine="ray"))
    local = stratify(src, str(tmp_path / "local"), options, OutputOptions(), RunSettings(threads=2, quiet=True))
    assert remote_maps and ray.manifest["run"]["engine"] == "ray"
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    assert ray.manifest["stats"] == local.manifest["stats"]


def stratify(src: str, dst: str, options: StratifyOptions, output: OutputOptions, run: RunSettings,
             **kwargs) -> object:
    """stratify as a library call: its definition through the driver."""
    return run_operation(stratify_op.OP, options, src, dst, output, run, **kwargs)


@pytest.mark.parametrize("entry", ["convert", "run_operation", "check", "inspect"])
def test_every_entry_point_runs_on_its_run_settings_engine(entry, src, tmp_path):
    """The Python API honours RunSettings(engine=...) like the CLI: each entry point opens the executor its run
    settings name and runs its passes there (here the pickling stand-in for Ray)."""
    from batchtool.check import CheckOptions, rules_from_flags
    from batchtool.exec.inspection import inspect as inspect_src
    from test_pickling_engine import PicklingEngine, standing_in

    engine, run, dst = PicklingEngine(), RunSettings(quiet=True, engine="ray", threads=2), str(tmp_path / "out")
    calls = {"convert": lambda: convert(src, dst, OutputOptions(), run=run),
             "run_operation": lambda: run_operation(SHUFFLE, ShuffleOptions(), src, dst, OutputOptions(), run),
             "check": lambda: check(src, rules_from_flags(unique=[("key",)]), CheckOptions(), run),
             "inspect": lambda: inspect_src(src, label="label", run=run)}
    with standing_in(engine):
        calls[entry]()
    assert engine.functions and engine.threads == 2


@RAY
def test_data_errors_keep_their_message(tmp_path, ray_cluster):
    table = make_table(120, seed=3)
    labels = table.column("label").to_numpy().copy()
    labels[77] = 9
    src = write_parquet_shards(str(tmp_path / "src"), table.set_column(1, "label", pa.array(labels)))
    with pytest.raises(LabelError) as ray_error:
        stratify(src, str(tmp_path / "ray"), StratifyOptions(mode="bernoulli", init_probs=(.25,) * 4),
                 OutputOptions(), RunSettings(quiet=True, engine="ray"))
    with pytest.raises(LabelError) as local_error:
        stratify(src, str(tmp_path / "local"), StratifyOptions(mode="bernoulli", init_probs=(.25,) * 4),
                 OutputOptions(), RunSettings(quiet=True))
    assert str(ray_error.value) == str(local_error.value)
    assert not os.path.exists(tmp_path / "ray")


# -- every operation: the same bytes and statistics as the local engine ------------------------------------

SEGMENT = ("--key", "key", "--sequence", "tokens,frames", "--context", "label", "--num-unroll", "4",
           "--batch-size", "8")
COMMANDS = {  # every engine path once; variants of an op run on the pickling stand-in (test_pickling_engine.py,
    # test_exchange_ops.py, test_spool.py), which ships every task as Ray does
    "convert": ("convert",),
    "stratify-exact": ("stratify", "--target", "uniform", "--seed", "3"),
    "stratify-bernoulli": ("stratify", "--target", "0.4,0.3,0.2,0.1", "--mode", "bernoulli"),
    "stratify-balanced": ("stratify", "--target", "uniform", "--batch-size", "8", "--balanced-batches"),
    "stratify-online": ("stratify", "--target", "uniform", "--mode", "online", "--num-classes", "4"),
    "resample-rate": ("resample", "--rate", "2.5", "--seed", "1"),
    "resample-running-mean": ("resample", "--weight", "weight", "--overall-rate", "1", "--running-mean"),
    "shuffle": ("shuffle", "--memory", "20KB", "--batch-size", "32"),
    "shuffle-buffered": ("shuffle", "--buffer", "64", "--min-after-dequeue", "16"),
    "bucket-boundaries": ("bucket", "--boundaries", "10,20,40", "--batch-size", "8", "--keep", "keep"),
    "bucket-auto-tokens": ("bucket", "--auto-buckets", "3", "--max-tokens", "200", "--mask", "--memory", "64KB"),
    "segment": ("segment", *SEGMENT),
}


def run_both(run_cli, args: tuple[str, ...], src: str, tmp_path) -> tuple[dict, dict]:
    """Run one command on both engines; return the (local, ray) manifests after checking the bytes."""
    manifests = {}
    for engine in ("local", "ray"):
        dst = str(tmp_path / engine)
        result = run_cli(args[0], src, dst, *args[1:], "--threads", "2", "-q", "--engine", engine)
        assert result.exit_code == 0, result.stderr
        with open(os.path.join(dst, ".batchtool_manifest.json")) as f:
            manifests[engine] = json.load(f)
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    assert manifests["ray"]["run"]["engine"] == "ray"
    return manifests["local"], manifests["ray"]


@RAY
@pytest.mark.parametrize("name", COMMANDS)
def test_same_output_as_local(name, src, tmp_path, run_cli, remote_maps):
    local, ray = run_both(run_cli, COMMANDS[name], src, tmp_path)
    assert remote_maps, "the work did not run on Ray"
    assert local["stats"] == ray["stats"] and local["output"] == ray["output"]


@RAY
@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_global_shuffle_sends_no_data_through_the_driver(fmt, src, tmp_path, ray_cluster, monkeypatch):
    """Map tasks scatter to files beside DST, the reduce task writes the shards: the same bytes (several shards,
    several key ranges) and statistics as the local engine, while everything the driver sent to or received
    from the workers was small metadata, with no Arrow data (out-of-band buffers) at all."""
    if fmt == "tfrecord":
        tfr = str(tmp_path / "tfr")
        convert(src, tfr, OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)),
                run=RunSettings(quiet=True))
        src = tfr
    out_of_band: list[int] = []
    for name in ("_pack", "_unpack"):
        original = getattr(ray_engine, name)

        def counted(obj, original=original):
            packed = obj if isinstance(obj, ray_engine._Packed) else None
            result = original(obj)
            out_of_band.append(len((packed or result).buffers))
            return result

        monkeypatch.setattr(ray_engine, name, counted)
    options, output = ShuffleOptions(batch_size=32), OutputOptions(shard_bytes=20_000)
    ray = run_operation(SHUFFLE, options, src, str(tmp_path / "ray"), output,
                        RunSettings(threads=2, quiet=True, engine="ray", memory=20_000), seed=4)
    local = run_operation(SHUFFLE, options, src, str(tmp_path / "local"), output,
                          RunSettings(threads=2, quiet=True, memory=20_000), seed=4)
    written = data_bytes(str(tmp_path / "local"))
    assert data_bytes(str(tmp_path / "ray")) == written and len(written) > 1
    assert ray.manifest["stats"] == local.manifest["stats"]
    moved = ray.manifest["run"]["ray"]
    assert moved["tasks"] > 2 and moved["local_items"] == 0
    assert out_of_band and not any(out_of_band)
    assert (moved["bytes_sent"] + moved["bytes_received"]) / moved["items"] < 2048, moved  # paths, schemas, counts


@RAY
def test_global_shuffle_failing_on_a_worker_leaves_nothing(src, tmp_path, run_cli, ray_cluster):
    """A corrupt record met by a map task: one error line naming it, exit 2, no DST and no temporary files."""
    tfr = tmp_path / "tfr"
    convert(src, str(tfr), OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)),
            run=RunSettings(quiet=True))
    raw = bytearray((tfr / "part-00001.tfrecord").read_bytes())
    raw[200] ^= 0xFF
    (tfr / "part-00001.tfrecord").write_bytes(bytes(raw))
    out = tmp_path / "out"
    out.mkdir()
    errors = {}
    for engine in ("local", "ray"):
        result = run_cli("shuffle", tfr, out / engine, "-q", "--engine", engine)
        assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        errors[engine] = result.stderr
    assert errors["ray"] == errors["local"] and "part-00001.tfrecord" in errors["ray"]
    assert os.listdir(out) == []


PIPELINE = """seed = 5
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
op = "bucket"
boundaries = "12,30"
batch-size = 16

[output]
path = "{dst}"
"""


@RAY
def test_pipeline_run(src, tmp_path, run_cli, remote_maps):
    """`run`: stages chained in one run, with a global shuffle spilled between them."""
    manifests = {}
    for engine in ("local", "ray"):
        pipeline = tmp_path / f"{engine}.toml"
        pipeline.write_text(PIPELINE.format(src=src, dst=tmp_path / engine))
        result = run_cli("run", pipeline, "--threads", "2", "-q", "--engine", engine)
        assert result.exit_code == 0, result.stderr
        manifests[engine] = json.loads((tmp_path / engine / ".batchtool_manifest.json").read_text())
    assert remote_maps
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    assert manifests["ray"]["stats"] == manifests["local"]["stats"]


AFTER_SHUFFLE = PIPELINE.replace("""[[stage]]
op = "bucket"
""", """[[stage]]
op = "resample"
rate = 2.5

[[stage]]
op = "bucket"
""")


@RAY
def test_pipeline_stages_after_a_shuffle_run_as_tasks(src, tmp_path, run_cli, remote_maps, monkeypatch):
    """A global shuffle in the middle: scattered and sorted on the workers beside DST, its batches read there by
    the stage after it (not by the driver), the stages after it run their kernels and the last one its batches
    as Ray tasks, none falling back to the driver's threads (which fails the run here); the local engine's bytes,
    and nothing left beside DST."""
    manifests = {}
    for engine in ("local", "ray"):
        if engine == "ray":
            def fell_back(fn, *args):
                # the engine's own choice to finish a function too cheap to ship on the driver is fine (it calls
                # its own reference to threaded_map); a map on the local executor instead of the engine is not
                raise AssertionError(f"{getattr(fn, '__qualname__', fn)} ran on the driver's threads")
            monkeypatch.setattr(runner, "threaded_map", fell_back)

            def on_the_driver(group, start=0):
                raise AssertionError("the driver read the shuffle's sorted files")
            monkeypatch.setattr(exchange.SortedGroup, "chunks", on_the_driver)  # the workers' own is untouched
        pipeline = tmp_path / f"{engine}.toml"
        pipeline.write_text(AFTER_SHUFFLE.format(src=src, dst=tmp_path / engine))
        result = run_cli("run", pipeline, "--threads", "2", "-q", "--engine", engine)
        assert result.exit_code == 0 and "warning: --engine ray" not in result.stderr, result.stderr
        manifests[engine] = json.loads((tmp_path / engine / ".batchtool_manifest.json").read_text())
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    assert manifests["ray"]["stats"] == manifests["local"]["stats"]
    kernels = {fn.args[0].name for fn in remote_maps if isinstance(fn, functools.partial) and fn.func is _kernel}
    assert {"stratify", "resample"} <= kernels, kernels
    assert sorted(os.listdir(tmp_path)) == ["local", "local.toml", "ray", "ray.toml"]


@RAY
def test_tfrecord_input(src, tmp_path, run_cli, ray_cluster):
    """TFRecord read tasks (records found by the driver's index pass, read, CRC-checked and decoded on the workers),
    also with --skip-corrupt."""
    tfr = str(tmp_path / "tfr")
    assert run_cli("convert", src, tfr, "--to", "tfrecord", "--shard-rows", "100", "-q").exit_code == 0
    path = os.path.join(tfr, "part-00001.tfrecord")
    raw = bytearray(open(path, "rb").read())
    raw[200] ^= 0xFF  # inside the first record's payload: its data CRC no longer matches
    open(path, "wb").write(bytes(raw))
    local, ray = run_both(run_cli, ("bucket", "--boundaries", "12,30", "--batch-size", "16", "--skip-corrupt"),
                          tfr, tmp_path)
    assert local["stats"] == ray["stats"] and ray["stats"]["corrupt_records_skipped"] == 1


@RAY
def test_tfrecord_read_tasks_send_offsets_not_records(tmp_path, run_cli, ray_cluster):
    """convert over TFRecord input: the workers read, frame, CRC-check and decode the records (and, without a
    manifest, scan them for the schema), the driver sends each task a path (and offsets); a few KB per task whatever
    the data size, and the local engine's bytes."""
    per_item = {}
    for rows, manifest in ((1200, True), (4800, True), (1200, False)):
        tfr = str(tmp_path / f"tfr{rows}")
        if not os.path.isdir(tfr):
            convert(write_parquet_shards(str(tmp_path / f"pq{rows}"), make_table(rows, seed=rows), shards=1), tfr,
                    OutputOptions(format="tfrecord", shard_rows=rows // 2, cast=("float64=float32",)),
                    run=RunSettings(quiet=True))
        src = tfr if manifest else os.path.join(tfr, "*.tfrecord")  # a glob: no manifest, so a schema pass
        size = sum(os.path.getsize(os.path.join(tfr, name)) for name in os.listdir(tfr) if name.endswith(".tfrecord"))
        out = tmp_path / f"{rows}-{manifest}"
        out.mkdir()
        _, ray = run_both(run_cli, ("convert",), src, out)
        moved = ray["run"]["ray"]
        ranges = 2 * -(-(rows // 2) // 1024)  # a spool task per 1,024-record range of each file (batchtool.exec.write)
        # then tasks measuring the spooled batches, one writing the shard, and without a manifest a schema step per
        # file: every item a task, none on the driver's threads
        assert moved["items"] >= ranges + 1 + (0 if manifest else 2) and moved["local_items"] == 0, moved
        assert moved["bytes_sent"] < size / 50, (moved, size)
        per_item[rows, manifest] = moved["bytes_sent"] / moved["items"]
    assert max(per_item.values()) < 4096 and per_item[4800, True] < 1.1 * per_item[1200, True], per_item


@RAY
def test_check_reports_the_same(src, tmp_path, run_cli, remote_maps):
    args = ("--num-classes", "4", "--target", "0.25,0.25,0.25,0.25", "--unique", "key", "--unique", "label,weight",
            "--no-nulls", "key,label", "--max-length", "40", "--min-rows", "10", "--max-offenders", "3")
    reports = {}
    for engine in ("local", "ray"):
        out = tmp_path / f"{engine}.json"
        result = run_cli("check", src, *args, "--json", out, "--threads", "2", "-q", "--engine", engine)
        assert result.exit_code == 1, result.stderr  # the proportions and length rules fail
        reports[engine] = json.loads(out.read_text())
    assert remote_maps
    for report in reports.values():
        report.pop("seconds")
    assert reports["ray"] == reports["local"]


@RAY
def test_s3_in_and_out(src, tmp_path, run_cli, s3, ray_cluster):
    pafs.copy_files(src, "data/ray-src", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=s3)
    args = ("--target", "uniform", "--batch-size", "8", "--balanced-batches", "-q", "--threads", "2")
    assert run_cli("stratify", src, tmp_path / "local", *args).exit_code == 0
    result = run_cli("stratify", "s3://data/ray-src", "s3://data/ray-out", *args, "--engine", "ray")
    assert result.exit_code == 0, result.stderr
    os.makedirs(tmp_path / "ray")
    pafs.copy_files("data/ray-out", str(tmp_path / "ray"), source_filesystem=s3,
                    destination_filesystem=pafs.LocalFileSystem())
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))


# -- usage errors (no Ray needed) ----------------------------------------------------------------------------


def test_engine_ray_without_the_extra(src, tmp_path, run_cli, monkeypatch):
    monkeypatch.setattr(ray_engine, "ray", None)
    for args in (("convert", src, tmp_path / "dst"), ("inspect", src)):
        result = run_cli(*args, "--engine", "ray")
        assert result.exit_code == 2
        assert result.stderr == "error: --engine ray needs the ray extra: pip install 'batchtool[ray]'\n"
    assert not os.path.exists(tmp_path / "dst")
    with pytest.raises(UsageError, match="ray extra"):
        stratify(src, str(tmp_path / "dst"), StratifyOptions(), OutputOptions(), RunSettings(engine="ray"))


def test_ray_address_needs_engine_ray(src, tmp_path, run_cli):
    result = run_cli("shuffle", src, tmp_path / "dst", "--ray-address", "auto")
    assert result.exit_code == 2 and result.stderr == "error: --ray-address auto: needs --engine ray\n"
    with pytest.raises(UsageError, match="--engine 'spark'"):
        RunSettings(engine="spark")


def test_a_failed_task_is_named_by_the_files_its_items_read(src):
    """What an error names a task by when Ray gives up on it: the files of its read units, else its items' place."""
    from batchtool.io.dataset import ReadReport
    from batchtool.io.inputs import open_dataset
    from batchtool.exec.engines.ray_failures import task_words

    units = list(enumerate(exchange.read_units(open_dataset(src), ReadReport())))
    first, last = (os.path.join(src, f"part-0000{i}.parquet") for i in (0, 1))
    assert task_words(units[:2], 0) == f"the task reading {first}"
    assert task_words(units, 0) == f"the task reading {first}, {last}"
    assert task_words([(4, 0.5), (5, 0.25)], 4) == "the task of items 4-5 of its pass"


def test_unreachable_ray_address_fails_fast():
    with pytest.raises(UsageError, match=r"^--ray-address 127.0.0.1:1: cannot connect to a Ray cluster"):
        ray_engine._check_reachable("127.0.0.1:1", "--ray-address 127.0.0.1:1")
    ray_engine._check_reachable("auto", "--ray-address auto")  # resolved by Ray itself


# -- segment's key check on the workers -------------------------------------------------------------------------


@RAY
def test_segment_key_hashes_stay_on_the_workers(tmp_path, run_cli, ray_cluster, monkeypatch):
    """Each chunk's task writes its key hashes beside DST and tasks find the repeats there: no examples come back
    with their hashes, the local engine's bytes and statistics, nothing left beside DST."""
    from batchtool.ops.segment.chunks import Examples

    rows = 8_000
    src = write_parquet_shards(str(tmp_path / "src"), make_table(rows, seed=5, median_length=2, max_length=4),
                               row_group_size=1_000)
    seen: list[Examples] = []
    original = ray_engine._unpack

    def unpacked(packed):
        result = original(packed)
        seen.extend(r for r in getattr(result, "results", []) if isinstance(r, Examples))
        return result

    monkeypatch.setattr(ray_engine, "_unpack", unpacked)
    (tmp_path / "out").mkdir()  # DST's parent exists: the workspace is beside DST
    local, ray = run_both(run_cli, ("segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "2",
                                    "--batch-size", "64"), src, tmp_path / "out")
    assert seen and all(examples.key_hash is None for examples in seen)
    assert local["stats"] == ray["stats"]
    assert sorted(os.listdir(tmp_path / "out")) == ["local", "ray"]


@RAY
def test_a_duplicate_segment_key_on_ray_fails_as_on_the_local_engine(tmp_path, run_cli, remote_maps):
    """Keys repeated across chunks and shards: the local engine's one error line (the first duplicate by id,
    confirmed), exit 2, DST untouched and no temporary directory left beside it."""
    from batchtool.exec import distinct
    from test_pickling_engine import repeated_keys_src

    dup = repeated_keys_src(str(tmp_path / "src"))
    out = tmp_path / "out"
    errors = {}
    for engine in ("local", "ray"):
        dst = out / engine
        dst.mkdir(parents=True)
        (dst / "kept").write_text("mine")
        result = run_cli("segment", dup, dst, *SEGMENT, "--overwrite", "-q", "--engine", engine)
        assert result.exit_code == 2 and result.stderr.startswith("error: duplicate key ")
        assert result.stderr.count("\n") == 1
        assert os.listdir(dst) == ["kept"] and (dst / "kept").read_text() == "mine"
        errors[engine] = result.stderr
    assert errors["ray"] == errors["local"]
    assert sorted(os.listdir(out)) == ["local", "ray"]
    assert any(getattr(fn, "func", None) is distinct._candidates for fn in remote_maps)


EXCHANGED = {
    "bucket": ("bucket", "--auto-buckets", "3", "--batch-size", "8", "--memory", "64KB", "--shard-rows", "100"),
}
"""(bucket --balance and balanced stratify run the same tasks: tests/exec/test_exchange_ops.py, and COMMANDS here)"""


@RAY
@pytest.mark.parametrize("name", EXCHANGED)
def test_bucket_and_balanced_batches_send_no_data_through_the_driver(name, src, tmp_path, run_cli, ray_cluster):
    """Scattered, sorted, cut and written on the workers: the local bytes and statistics, while what the driver
    sends and receives (plans, paths, counts, every batch's size) is a small fraction of the output's bytes."""
    local, ray = run_both(run_cli, EXCHANGED[name], src, tmp_path)
    assert local["stats"] == ray["stats"] and local["output"] == ray["output"]
    moved = ray["run"]["ray"]
    assert moved["local_items"] == 0 and moved["tasks"] > 3, moved
    written = sum(os.path.getsize(os.path.join(tmp_path / "ray", f)) for f in os.listdir(tmp_path / "ray"))
    assert (moved["bytes_sent"] + moved["bytes_received"]) * 4 < written, (moved, written)


@RAY
@pytest.mark.parametrize("args", [("bucket", "--boundaries", "10,20", "--batch-size", "8", "--shard-rows", "100"),
                                  ("pack", "--max-length", "64", "--sequence", "tokens", "--split-long")],
                         ids=["bucket", "pack"])
def test_input_row_keys_are_kept_on_the_workers(args, tmp_path, run_cli, remote_maps):
    """Without a key column the index keys each example by its input row, which the shards' tasks keep on the
    workers: the same index bytes as the local engine's."""
    src = write_parquet_shards(str(tmp_path / "src"), make_table(300, seed=7).drop(["key"]))
    local, ray = run_both(run_cli, args, src, tmp_path)
    assert remote_maps and local["output"] == ray["output"] and ray["output"]["index"]["rows"] == "input"


@RAY
def test_convert_spools_its_output_on_the_workers(tmp_path, run_cli, ray_cluster):
    """convert on Ray: each read unit's output spooled and the shards written on the workers (batchtool.spool; the
    row ops do the same: tests/exec/test_spool.py), the local bytes and statistics, and what crossed to and from the
    driver far below the data."""
    args = ("convert", "--shard-rows", "6000")
    table = make_table(20_000, seed=5)
    src = write_parquet_shards(str(tmp_path / "src"), table, row_group_size=2_000)
    local, ray = run_both(run_cli, args, src, tmp_path)
    assert local["stats"] == ray["stats"] and local["output"] == ray["output"]
    assert len(data_bytes(str(tmp_path / "ray"))) > 1
    moved = ray["run"]["ray"]
    assert moved["local_items"] == 0
    assert moved["bytes_received"] < table.nbytes / 20 and moved["bytes_sent"] < table.nbytes / 20, \
        (moved, table.nbytes)
    assert sorted(os.listdir(tmp_path)) == ["local", "ray", "src"]


@RAY
def test_segment_keeps_its_examples_beside_the_output(tmp_path, run_cli, ray_cluster):
    """segment on Ray with DST a path: each chunk's rows stay beside DST where the task that prepared them wrote
    them, the lane planner and its work items carry only numbers and paths, and the batches are written where
    they are built; the local bytes, and a fraction of the data through the driver either way."""
    table = make_table(8_000, seed=6)
    src = write_parquet_shards(str(tmp_path / "src"), table, row_group_size=1_000)
    args = ("segment", "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "16", "--batch-size", "16")
    local, ray = run_both(run_cli, args, src, tmp_path)
    assert local["stats"] == ray["stats"] and local["output"] == ray["output"]
    moved = ray["run"]["ray"]
    # the work items' slot numbers (16 bytes a segment) are what is left: every row would be 2x the data
    assert moved["bytes_sent"] < table.nbytes / 5 and moved["bytes_received"] < table.nbytes / 20, \
        (moved, table.nbytes)
    assert sorted(os.listdir(tmp_path)) == ["local", "ray", "src"]


@RAY
@pytest.mark.parametrize("extra", [(), ("--batch-size", "8")], ids=["shuffled", "batches"])
def test_mix_of_a_parquet_and_a_tfrecord_source_runs_on_the_workers(extra, src, tmp_path, run_cli, ray_cluster):
    """mix on Ray: each source read by its own format on the workers (the TFRecord one too), the selection and the
    shuffle or balanced batches there; the local bytes and statistics, and no work left to the driver's threads."""
    tfr = str(tmp_path / "tfr")
    convert(src, tfr, OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)),
            run=RunSettings(quiet=True))
    manifests = {}
    for engine in ("local", "ray"):
        dst = str(tmp_path / engine)
        result = run_cli("mix", src, tfr, dst, "--columns", "key,label,tokens", "--weights", "2,1", "--replacement",
                         "--size", "500", "--memory", "40KB", *extra, "--threads", "2", "-q", "--engine", engine)
        assert result.exit_code == 0, result.stderr
        with open(os.path.join(dst, ".batchtool_manifest.json")) as f:
            manifests[engine] = json.load(f)
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    local, ray = manifests["local"], manifests["ray"]
    assert local["stats"] == ray["stats"] and local["output"] == ray["output"]
    assert [s["taken"] for s in ray["stats"]["sources"]] == [333, 167]  # 333.3 and 166.7: the larger remainder gets the row
    assert ray["run"]["ray"]["local_items"] == 0 and ray["run"]["ray"]["tasks"] > 3, ray["run"]["ray"]


@RAY
def test_sigterm_while_the_driver_waits_on_ray_ends_in_one_line(src, tmp_path, ray_cluster):
    """SIGTERM while the driver waits for a map task (inside Ray's wait, whose C++ code runs the signal's handler
    and wrapped what it raised in a SystemError: exit 1 and a traceback): exit 143, the one line, nothing left
    beside DST or in the temporary directory. The tasks sleep for an hour: only the signal ends the command."""
    (tmp_path / "out").mkdir()
    (tmp_path / "tmp").mkdir()
    proc = start_parked("ray-task:", "shuffle", src, tmp_path / "out" / "dst", "-q", "--engine", "ray",
                        "--ray-address", ray_cluster.get_runtime_context().gcs_address,
                        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 143, err
    # batchtool's one line, last; before it at most a log line of Ray's own C++ code (a slow connect, on a loaded
    # machine), never a traceback
    lines = err.splitlines()
    assert lines[-1] == "error: interrupted by SIGTERM; temporary files removed", err
    assert all(line.startswith("[") for line in lines[:-1]), err
    assert os.listdir(tmp_path / "out") == [] and os.listdir(tmp_path / "tmp") == []
