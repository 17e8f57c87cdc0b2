"""convert and the row ops on a remote engine (batchtool.exec.write) without Ray: run with --engine ray on the pickling stand-in engine
(tests/engines/test_pickling_engine.py), each read unit's output is spooled and the shards written on its "workers", and
only counts come back; the local engine's bytes and manifest, and its errors with nothing left behind. (On a real
Ray cluster: tests/engines/test_ray.py.)"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import test_pickling_engine
from batchtool.exec import shards
from batchtool.exec.convert import _as_is, convert
from batchtool.io.dataset import ReadReport
from batchtool.core.run_settings import RunSettings
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table
from conftest import write_parquet_shards
from test_pickling_engine import PicklingEngine, fails_alike, pipeline, run_both

ROWS = 600


class MeasuringEngine(PicklingEngine):
    """The pickling engine, also counting the bytes of the results that come back to the driver, by task name."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[str, int] = {}

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], window: int | None = None) -> Iterator[Any]:
        name = task_name(fn)
        for result in super().map(fn, items, window):
            self.received[name] = self.received.get(name, 0) + len(pickle.dumps(result))
            yield result


def task_name(fn: Callable[[Any], Any]) -> str:
    return getattr(getattr(fn, "func", fn), "__name__", "")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """600 rows in 3 Parquet shards of 50-row row groups (with booleans `keep` and `never`), and the same as TFRecord."""
    root = tmp_path_factory.mktemp("sources")
    table = make_table(ROWS, seed=11)
    table = table.append_column("keep", pa.array(np.arange(ROWS) % 7 != 0))
    table = table.append_column("never", pa.array(np.zeros(ROWS, dtype=bool)))
    parquet = write_parquet_shards(str(root / "parquet"), table, shards=3)
    convert(parquet, str(root / "tfrecord"), OutputOptions(format="tfrecord", shard_rows=200),
            run=RunSettings(quiet=True))
    return {"parquet": parquet, "tfrecord": str(root / "tfrecord")}


def spooled(engine: PicklingEngine) -> set[str]:
    """The names of the spool and shard-writing tasks the engine ran."""
    return {task_name(fn) for fn in engine.functions} & {"_spool", "_kernel", "_write_shard"}


CASES = {
    "convert-parquet-shard-rows": ("parquet", ("convert", "--shard-rows", "130")),
    "convert-tfrecord-in-arrow-out-shard-bytes": ("tfrecord", ("convert", "--to", "arrow", "--shard-bytes", "40KB")),
    "convert-to-tfrecord": ("parquet", ("convert", "--to", "tfrecord", "--shard-rows", "250")),
    "convert-to-gzip-tfrecord-shard-bytes": ("parquet", ("convert", "--to", "tfrecord", "--compression", "gzip",
                                                         "--shard-bytes", "30KB")),
    "convert-columns-parquet-shard-bytes": ("parquet", ("convert", "--columns", "tokens,label", "--shard-bytes",
                                                        "8KB")),
    "filter": ("parquet", ("filter", "--column", "keep", "--shard-rows", "100")),
    "select": ("tfrecord", ("select", "--columns", "tokens,key", "--to", "arrow", "--shard-rows", "250")),
    "rename": ("parquet", ("rename", "--columns", "label=class", "--shard-bytes", "20KB")),
    "stratify-exact": ("parquet", ("stratify", "--target", "uniform", "--seed", "3", "--shard-rows", "8")),
    "stratify-bernoulli": ("tfrecord", ("stratify", "--target", "0.4,0.3,0.2,0.1", "--mode", "bernoulli", "--seed",
                                        "2", "--to", "tfrecord", "--shard-rows", "15")),
    "stratify-replacement": ("parquet", ("stratify", "--target", "uniform", "--replacement", "--size", "1500",
                                         "--seed", "4", "--shard-rows", "400")),
    "resample-rate": ("parquet", ("resample", "--rate", "2.5", "--seed", "1", "--shard-bytes", "60KB")),
    "resample-weight": ("tfrecord", ("resample", "--weight", "weight", "--overall-rate", "1.5", "--to", "arrow",
                                     "--shard-rows", "200")),
}


@pytest.mark.parametrize("case", CASES)
def test_row_commands_spool_on_the_workers_and_write_the_local_bytes(case, sources, run_cli, tmp_path, monkeypatch):
    fmt, (command, *flags) = CASES[case]
    monkeypatch.setattr(test_pickling_engine, "PicklingEngine", MeasuringEngine)
    engine = run_both(run_cli, tmp_path, lambda dst: [command, sources[fmt], dst, *flags])
    ran = spooled(engine)
    assert "_spool" in ran and ran & {"_write_shard"} and "_kernel" not in ran, ran
    written = sum(engine.received.get(name, 0) for name in ("_spool", "_measure", "_write_shard"))
    assert written < 12_000, f"output data came back to the driver: {engine.received}"  # the input: about 300KB
    assert sorted(os.listdir(tmp_path)) == ["local", "pickled"]  # nothing left beside DST


BUILT = {
    "segment": ("parquet", ("segment", "--key", "key", "--sequence", "tokens,frames", "--context", "label",
                            "--num-unroll", "4", "--batch-size", "8", "--shard-rows", "200")),
    "pack": ("parquet", ("pack", "--max-length", "512", "--sequence", "tokens", "--batch-size", "4", "--to", "arrow",
                         "--shard-bytes", "40KB")),
}


@pytest.mark.parametrize("case", BUILT)
def test_built_batches_are_written_where_they_are_built(case, sources, run_cli, tmp_path):
    """segment's batches, built from items the driver plans, are spooled by the task that builds them, pack's read
    from its sorted groups by the tasks that write them, and written as shards on the workers: the local bytes,
    and none of them comes back to the driver."""
    fmt, args = BUILT[case]
    engine = run_both(run_cli, tmp_path, lambda dst: [args[0], sources[fmt], dst, *args[1:]])
    assert "_write_shard" in spooled(engine) and ("_spool" in spooled(engine)) == (case == "segment"), spooled(engine)
    assert sorted(os.listdir(tmp_path)) == ["local", "pickled"]


def test_per_chunk_plans_are_made_on_the_driver_and_worked_on_the_workers(sources, run_cli, tmp_path):
    """--running-mean plans each chunk from the ones before it: the driver reads the chunks in order for their plans,
    each chunk's kernel and its output's writing run on the workers; the local bytes."""
    engine = run_both(run_cli, tmp_path, lambda dst: ["resample", sources["parquet"], dst, "--weight", "weight",
                                                      "--overall-rate", "1", "--running-mean"])
    assert {"_spool", "_write_shard"} <= spooled(engine)


def test_an_empty_output_writes_the_one_empty_shard(sources, run_cli, tmp_path):
    """Every row filtered out: no batch spooled, and the one empty shard the local writer writes."""
    engine = run_both(run_cli, tmp_path, lambda dst: ["filter", sources["parquet"], dst, "--column", "never"])
    assert {"_spool", "_write_shard"} <= spooled(engine)


def test_a_bad_label_mid_stream_fails_as_locally(tmp_path, run_cli):
    """A label outside --num-classes past the first chunk: the local error, every bad label counted."""
    table = make_table(300, seed=3)
    labels = table.column("label").to_numpy().copy()
    labels[[170, 260, 290]] = 9
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))
    src = write_parquet_shards(str(tmp_path / "src"), table)
    engine, stderr = fails_alike(run_cli, tmp_path, ["stratify", src, "--label", "label", "--target", "uniform",
                                                     "--num-classes", "4", "--mode", "bernoulli", "--init-probs",
                                                     "0.25,0.25,0.25,0.25"])
    assert "3 " in stderr and "_spool" in spooled(engine), stderr


@pytest.fixture
def corrupt(sources, tmp_path) -> str:
    """The TFRecord source with one record's payload damaged in its second file."""
    src = str(tmp_path / "corrupt")
    shutil.copytree(sources["tfrecord"], src)
    path = os.path.join(src, "part-00001.tfrecord")
    raw = bytearray(open(path, "rb").read())
    raw[5000] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    return src


def test_a_corrupt_record_fails_as_locally(corrupt, tmp_path, run_cli):
    engine, stderr = fails_alike(run_cli, tmp_path, ["convert", corrupt])
    assert "part-00001.tfrecord" in stderr and "_spool" in spooled(engine)


def test_skipped_corrupt_records_are_counted_alike(corrupt, tmp_path, run_cli):
    engine = run_both(run_cli, tmp_path, lambda dst: ["filter", corrupt, dst, "--column", "keep", "--skip-corrupt"])
    assert "_spool" in spooled(engine)
    manifest = test_pickling_engine.manifest(str(tmp_path / "pickled"))
    assert manifest["stats"]["corrupt_records_skipped"] >= 1


def test_a_spool_task_run_twice_spools_once(sources, tmp_path):
    """A retried task replaces its file: the batches a reader gets are the unit's, once."""
    from batchtool.exec import exchange
    from batchtool.io.inputs import open_dataset

    dataset = open_dataset(sources["parquet"])
    unit = next(exchange.read_units(dataset, ReadReport()))
    job = shards._SpoolJob(str(tmp_path), functools.partial(_as_is, OutputOptions()), "dst")
    first, again = shards._spool(job, (0, unit)), shards._spool(job, (0, unit))
    assert first.rows == again.rows == (50,) and first.consumed == 50
    assert os.listdir(tmp_path) == ["s000000000.arrow"]
    batches = shards.SpooledBatches(str(tmp_path), (0,), (1,), first.rows)
    assert [b.num_rows for b in batches.reader(0, 1)()] == [50]
    assert functools.reduce(lambda n, b: n + b.num_rows, batches.reader(1, 1)(), 0) == 0


PIPELINES = {
    "row-stages": """seed = 5
[input]
path = "{src}"
[[stage]]
op = "filter"
column = "keep"
[[stage]]
op = "stratify"
target = "0.7,0.1,0.1,0.1"
replacement = true
[[stage]]
op = "rename"
columns = {{ tokens = "ids" }}
[output]
path = "{dst}"
shard-rows = 150
""",
    "one-stage": """seed = 5
[input]
path = "{src}"
[[stage]]
op = "resample"
rate = 2.5
[output]
path = "{dst}"
format = "arrow"
shard-bytes = "50KB"
""",
    "after-a-shuffle": """seed = 5
memory = "64KB"
[input]
path = "{src}"
[[stage]]
op = "shuffle"
[[stage]]
op = "select"
columns = "tokens,label"
[output]
path = "{dst}"
""",
}


@pytest.mark.parametrize("case", PIPELINES)
def test_a_pipeline_ending_in_a_row_stage_spools_on_the_workers(case, sources, tmp_path, run_cli):
    """The last row stage's output spooled and written on the workers: the local bytes and manifest."""
    engine = run_both(run_cli, tmp_path, pipeline(tmp_path, PIPELINES[case], src=sources["parquet"]))
    assert "_spool" in spooled(engine) and spooled(engine) & {"_write_shard"}
    assert sorted(os.listdir(tmp_path)) == ["local", "local.toml", "pickled", "pickled.toml"]


@pytest.mark.parametrize("fmt,compression", [("arrow", None), ("arrow", "zstd"), ("parquet", None),
                                             ("parquet", "snappy"), ("tfrecord", None), ("tfrecord", "gzip")])
def test_a_file_s_header_is_what_its_first_batch_carries_beyond_its_own_bytes(fmt, compression):
    """Measured once from an empty batch, the header is what a real batch adds as a file's first beyond what it adds
    as its second (Arrow IPC writes its schema with the first batch, Parquet its magic when opened), so a worker's
    measured run, less the header on its first batch, gives each batch's own bytes."""
    output = OutputOptions(format=fmt, compression=compression)
    batch = make_table(20, seed=3).to_batches()[0]
    first, again = shards._measure(shards.Encoded(lambda: iter([batch, batch]), output, batch.schema))
    header = shards.header_bytes(output, batch.schema)
    assert header == first - again
    assert header > 0 if fmt in ("arrow", "parquet") else header == 0
