"""The global shuffle's exchange (batchtool.exec.exchange) as a remote engine runs it, on the pickling stand-in: the same
bytes and statistics as the local engine's, for Parquet and TFRecord input, several shards (measured and written by
tasks) and a dropped remainder; a failure leaves DST and no temporary files behind. (On Ray: tests/engines/test_ray.py.)"""

from __future__ import annotations

import os
import shutil

import pytest

from batchtool.exec.convert import convert
from batchtool.core import rng
from batchtool.exec.driver import EngineRuntime, run_operation
from batchtool.core.errors import DestinationError, InputError
from batchtool.exec.exchange import MapJob, Workspace, _map, read_units, regrouping
from batchtool.io.inputs import open_dataset
from batchtool.ops.regroup import Input, Scatter
from batchtool.io.dataset import ReadReport
from batchtool.core.run_settings import RunSettings
from batchtool.exec.job import open_source
from batchtool.ops.shuffle import OP, ShuffleOptions
from batchtool.io.output import OutputOptions
from batchtool.core.runner import SERIAL
from batchtool.core.synthetic import make_table
from conftest import data_bytes, write_parquet_shards
from test_pickling_engine import PicklingEngine, standing_in


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """400 rows as Parquet (2 shards of 50-row row groups) and as TFRecord (4 files, with a manifest)."""
    root = tmp_path_factory.mktemp("sources")
    parquet = write_parquet_shards(str(root / "parquet"), make_table(400, seed=5))
    convert(parquet, str(root / "tfrecord"),
            OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)), run=RunSettings(quiet=True))
    return {"parquet": parquet, "tfrecord": str(root / "tfrecord")}


CASES = {
    "parquet-several-parts-and-shards": ("parquet", ShuffleOptions(batch_size=32),
                                         OutputOptions(shard_bytes=30_000), 20_000),
    "tfrecord-default-batches": ("tfrecord", ShuffleOptions(), OutputOptions(shard_rows=150), 1 << 20),
    "tfrecord-out-drop-remainder": ("parquet", ShuffleOptions(batch_size=7, drop_remainder=True),
                                    OutputOptions(format="tfrecord", shard_rows=100, cast=("float64=float32",)), 50_000),
    "tfrecord-out-by-bytes": ("parquet", ShuffleOptions(batch_size=16),
                              OutputOptions(format="tfrecord", shard_bytes=40_000, cast=("float64=float32",)), None),
    "gzip-tfrecord-out": ("tfrecord", ShuffleOptions(batch_size=16),
                          OutputOptions(format="tfrecord", compression="gzip", shard_bytes=20_000), None),
    "arrow-out": ("parquet", ShuffleOptions(batch_size=16), OutputOptions(format="arrow", shard_bytes=60_000), None),
    "arrow-out-several-parts": ("parquet", ShuffleOptions(batch_size=16),
                                OutputOptions(format="arrow", shard_bytes=60_000), 20_000),
}


def exchanged(src: str, dst: str, options: ShuffleOptions, output: OutputOptions, seed: int,
              skip_corrupt: bool = False, memory: int | None = None):
    """The command as a remote engine runs it (the pickling stand-in): its workspace beside DST, its shards measured
    and written by tasks."""
    with standing_in(PicklingEngine()):
        return run_operation(OP, options, src, dst, output, RunSettings(threads=2, quiet=True, engine="ray", memory=memory),
                             seed=seed, skip_corrupt=skip_corrupt)


def shuffle(src: str, dst: str, options: ShuffleOptions, output: OutputOptions, run: RunSettings, *, seed: int = 0,
            skip_corrupt: bool = False):
    """The local spill, as the command runs it."""
    return run_operation(OP, options, src, dst, output, run, seed=seed, skip_corrupt=skip_corrupt)


@pytest.mark.parametrize("case", CASES)
def test_same_bytes_and_stats_as_the_local_spill(case, sources, tmp_path, monkeypatch):
    fmt, options, output, memory = CASES[case]
    src = sources[fmt]
    local = shuffle(src, str(tmp_path / "local"), options, output, RunSettings(threads=2, quiet=True, memory=memory),
                    seed=3)
    ours = exchanged(src, str(tmp_path / "exchanged"), options, output, seed=3, memory=memory)
    assert data_bytes(str(tmp_path / "exchanged")) == data_bytes(str(tmp_path / "local"))
    assert len(data_bytes(str(tmp_path / "local"))) > 1 or options.batch_size is None  # (400 rows: one batch)
    assert ours.manifest["stats"] == local.manifest["stats"] and ours.manifest["output"] == local.manifest["output"]
    assert (ours.rows_in, ours.rows_out) == (local.rows_in, local.rows_out)
    assert sorted(os.listdir(tmp_path)) == ["exchanged", "local"]  # no exchange or temporary directory left


def test_a_corrupt_input_fails_the_same_and_leaves_nothing(sources, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(sources["tfrecord"], src)
    raw = bytearray((src / "part-00001.tfrecord").read_bytes())
    raw[200] ^= 0xFF  # inside the first record's payload: its data CRC no longer matches
    (src / "part-00001.tfrecord").write_bytes(bytes(raw))
    with pytest.raises(InputError) as ours:
        exchanged(str(src), str(tmp_path / "dst"), ShuffleOptions(), OutputOptions(), seed=0)
    with pytest.raises(InputError) as local:
        shuffle(str(src), str(tmp_path / "dst"), ShuffleOptions(), OutputOptions(), RunSettings(quiet=True))
    assert str(ours.value) == str(local.value)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_skipped_corrupt_records_are_counted_as_locally(sources, tmp_path):
    """--skip-corrupt: the map tasks frame the records, and what they skip reaches the manifest in order."""
    src = tmp_path / "src"
    shutil.copytree(sources["tfrecord"], src)
    raw = bytearray((src / "part-00002.tfrecord").read_bytes())
    raw[200] ^= 0xFF
    (src / "part-00002.tfrecord").write_bytes(bytes(raw))
    options, output = ShuffleOptions(batch_size=16), OutputOptions()
    local = shuffle(str(src), str(tmp_path / "local"), options, output, RunSettings(quiet=True), skip_corrupt=True)
    ours = exchanged(str(src), str(tmp_path / "ours"), options, output, seed=0, skip_corrupt=True)
    assert data_bytes(str(tmp_path / "ours")) == data_bytes(str(tmp_path / "local"))
    assert ours.manifest["stats"] == local.manifest["stats"] and local.manifest["stats"]["corrupt_records_skipped"] == 1


def test_a_worker_that_cannot_see_the_exchange_directory_says_so(sources, tmp_path):
    """On a cluster whose nodes do not share DST's filesystem, the first map task stops the command."""
    dataset = open_source(sources["parquet"], str(tmp_path / "dst"), OutputOptions(), RunSettings(), SERIAL)
    unit = next(read_units(dataset, ReadReport()))
    job = MapJob(Workspace(str(tmp_path / "elsewhere"), "out/"), Scatter(dataset.schema, (1,), 0, "shuffle", 1 << 16))
    with pytest.raises(DestinationError, match=r"^out/: the exchange directory .*elsewhere is not visible on .*: "
                                               r"with --engine ray the workers write temporary files beside DST, "
                                               r"so DST must be on storage every node shares$"):
        _map(job, (0, unit))
    assert not os.path.exists(tmp_path / "elsewhere")


def test_one_tfrecord_file_is_scattered_by_several_map_tasks(sources, tmp_path, monkeypatch):
    """An uncompressed TFRecord file is read in byte ranges of about 1,024 records, a map task each (the worker
    frames and checks its range), not in one task per file: one big file still spreads over the workers."""
    src = str(tmp_path / "one")
    convert(sources["parquet"], src, OutputOptions(format="tfrecord"), run=RunSettings(quiet=True))
    monkeypatch.setattr("batchtool.io.formats.tfrecord.format.CHUNK_RECORDS", 64)
    units = list(read_units(open_source(src, str(tmp_path / "dst"), OutputOptions(), RunSettings(), SERIAL),
                            ReadReport()))
    assert len(os.listdir(src)) == 2 and len(units) == -(-400 // 64)  # one data file (and its manifest)
    local = shuffle(src, str(tmp_path / "local"), ShuffleOptions(batch_size=16), OutputOptions(),
                    RunSettings(threads=2, quiet=True), seed=1)
    ours = exchanged(src, str(tmp_path / "ours"), ShuffleOptions(batch_size=16), OutputOptions(), seed=1)
    assert data_bytes(str(tmp_path / "ours")) == data_bytes(str(tmp_path / "local"))
    assert ours.manifest["stats"] == local.manifest["stats"]


class _Told:
    """An op whose regroup keeps what it is told of its input and what its probes found."""

    def regroup(self, plan, input, probe):
        self.input, self.first = input, probe(_first_key)
        self.second = probe(_NthKey(), in_order=True)
        return plan


def _first_key(chunk):
    return chunk.data.column("key")[0].as_py()


class _NthKey:
    """A measure with state from chunk to chunk: the first key of the second chunk it sees."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, chunk):
        self.seen += 1
        return _first_key(chunk) if self.seen == 2 else None


def _numbered_ids(index, chunk):
    return index, chunk.data.schema.names, chunk.ids.tolist()


def test_a_regrouping_op_is_told_its_input_and_fed_its_rows(sources, tmp_path):
    """regroup gets ops.regroup.Input, never the dataset, and probes on a worker or in order on the driver; the
    runtime feeds the rows: map_rows numbers the chunks of the asked columns in input order, through pickles as on a
    cluster, and rows gives the same chunks."""
    dataset = open_dataset(sources["parquet"])
    op, keys = _Told(), dataset.chunks(["key"])
    keys = [c.data.column("key").to_pylist() for c in keys]
    regrouped, _ = regrouping(op, "plan", dataset, read_units(dataset, ReadReport()), SERIAL)
    assert regrouped == "plan" and isinstance(op.input, Input)
    told = op.input
    assert (told.schema, told.num_rows, told.estimate_rows, told.gzip) == (dataset.schema, 400, 400, False)
    row = (1 << rng.SHARD_BITS) + 7  # the second file's row 7
    assert op.input.locate(row) == dataset.locate(row) and "part-00001" in op.input.locate(row)
    assert (op.first, op.second) == (keys[0][0], keys[1][0])
    engine = PicklingEngine()
    runtime = EngineRuntime(dataset, engine, Workspace(str(tmp_path), "out", shared=True))
    fed = list(runtime.map_rows(_numbered_ids, ["key"], ReadReport()))
    assert [index for index, _, _ in fed] == list(range(8)) and all(names == ["key"] for _, names, _ in fed)
    assert [ids for _, _, ids in fed] == [c.ids.tolist() for c in runtime.rows(["key"], ReadReport())]
    assert engine.items == 16  # both passes read each chunk on the engine, its task sent through pickles
