"""bucket's and stratify --balanced-batches' map-reduce (Operation.exchange) without Ray: the command run with
--engine ray on the pickling stand-in engine (tests/engines/test_pickling_engine.py) scatters, sorts and writes on its
"workers" and must write the local engine's bytes and statistics; errors found in a map task read as the local
ones and leave nothing behind. (On a real Ray cluster: tests/engines/test_ray.py.)"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtool.exec.convert import convert
from batchtool.core.run_settings import RunSettings
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table
from conftest import write_parquet_shards
from test_pickling_engine import PicklingEngine, fails_alike, run_both


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """600 rows in 3 Parquet shards of 50-row row groups (with a boolean `keep`), and the same as TFRecord."""
    root = tmp_path_factory.mktemp("sources")
    table = make_table(600, seed=11)
    table = table.append_column("keep", pa.array(np.arange(600) % 7 != 0))
    parquet = write_parquet_shards(str(root / "parquet"), table, shards=3)
    convert(parquet, str(root / "tfrecord"), OutputOptions(format="tfrecord", shard_rows=200),
            run=RunSettings(quiet=True))
    return {"parquet": parquet, "tfrecord": str(root / "tfrecord")}


def exchanged(engine: PicklingEngine) -> list[str]:
    """The names of the map-reduce tasks the engine ran (empty: the op regrouped on the driver)."""
    names = [getattr(getattr(fn, "func", fn), "__name__", "") for fn in engine.functions]
    return [name for name in names if name in ("_map", "_sort_part", "_write_shard")]


BUCKET = {
    "by-count-several-parts-and-shards": ("parquet", ("--length", "tokens", "--auto-buckets", "4", "--batch-size",
                                                      "16", "--memory", "200KB", "--to", "arrow", "--shard-bytes",
                                                      "150KB")),
    "keep-drop-remainder-tfrecord-in": ("tfrecord", ("--length", "tokens", "--boundaries", "8,20,40", "--batch-size",
                                                     "8,8,4,4", "--keep", "keep", "--drop-remainder", "--shard-rows",
                                                     "120")),
    "max-tokens-sorted": ("parquet", ("--length", "tokens", "--auto-buckets", "3", "--max-tokens", "600",
                                      "--order", "sorted", "--memory", "200KB", "--to", "arrow")),
    "quadratic-drop-oversize-tfrecord-out": ("parquet", ("--length", "tokens", "--auto-buckets", "3", "--max-tokens",
                                                         "4000", "--cost", "quadratic", "--drop-oversize",
                                                         "--drop-remainder", "--to", "tfrecord", "--shard-rows",
                                                         "100")),
    "pad-to-boundary-mask": ("parquet", ("--length", "tokens", "--boundaries", "10,30", "--batch-size", "8",
                                         "--pad-to-boundary", "--mask", "--pad-value", "tokens=-1")),
    "balance": ("parquet", ("--length", "tokens", "--auto-buckets", "2", "--batch-size", "8", "--balance", "label",
                            "--target", "uniform", "--to", "arrow")),
    "balance-oversample-drop-remainder": ("tfrecord", ("--length", "tokens", "--auto-buckets", "3", "--batch-size",
                                                       "6", "--balance", "label", "--target", "0.4,0.3,0.2,0.1",
                                                       "--oversample", "--drop-remainder", "--memory", "200KB")),
}


@pytest.mark.parametrize("case", BUCKET)
def test_bucket_on_the_workers_writes_the_local_bytes(case, sources, run_cli, tmp_path):
    fmt, flags = BUCKET[case]
    engine = run_both(run_cli, tmp_path, lambda dst: ["bucket", sources[fmt], dst, "--seed", "4", *flags])
    assert {"_map", "_sort_part"} <= set(exchanged(engine))
    assert sorted(os.listdir(tmp_path)) == ["local", "pickled"]  # no exchange directory left beside DST


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(0, 120), buckets=st.integers(1, 4), batch=st.integers(1, 9), seed=st.integers(0, 99),
       sorted_order=st.booleans(), drop=st.booleans(), memory=st.sampled_from(["20KB", "64MB"]))
def test_bucket_exchange_property(rows, buckets, batch, seed, sorted_order, drop, memory, run_cli, tmp_path_factory):
    """Any small input and options: the same bytes and statistics on the workers as on the driver."""
    root = tmp_path_factory.mktemp("prop")
    src = write_parquet_shards(str(root / "src"), make_table(rows, seed=seed), row_group_size=17)
    flags = ["--length", "tokens", "--auto-buckets", str(buckets), "--batch-size", str(batch), "--memory", memory,
             "--seed", str(seed), "--to", "arrow", "--shard-rows", "40"]
    flags += ["--order", "sorted"] if sorted_order else []
    flags += ["--drop-remainder"] if drop else []
    run_both(run_cli, root, lambda dst: ["bucket", src, dst, *flags])


STRATIFY = {
    "uniform-several-parts": ("parquet", ("--target", "uniform", "--memory", "100KB", "--to", "arrow")),
    "skewed-drop-remainder-tfrecord": ("tfrecord", ("--target", "0.4,0.3,0.2,0.1", "--drop-remainder",
                                                    "--shard-rows", "64")),
    "replacement": ("parquet", ("--target", "uniform", "--replacement", "--size", "1500", "--memory", "100KB",
                                "--to", "arrow", "--shard-bytes", "100KB")),
    "bernoulli-tfrecord-out": ("parquet", ("--target", "uniform", "--mode", "bernoulli", "--to", "tfrecord")),
}


@pytest.mark.parametrize("case", STRATIFY)
def test_balanced_batches_on_the_workers_write_the_local_bytes(case, sources, run_cli, tmp_path):
    fmt, flags = STRATIFY[case]
    engine = run_both(run_cli, tmp_path, lambda dst: ["stratify", sources[fmt], dst, "--label", "label", "--seed", "2",
                                                      "--batch-size", "12", "--balanced-batches", *flags])
    assert {"_map", "_sort_part"} <= set(exchanged(engine))
    assert sorted(os.listdir(tmp_path)) == ["local", "pickled"]


def test_online_balanced_batches_are_selected_in_input_order(sources, run_cli, tmp_path):
    """--mode online plans each chunk from the ones before it: the selection is scattered in input order on the
    driver (no map task), then sorted and written by the same tasks, with the local bytes."""
    engine = run_both(run_cli, tmp_path, lambda dst: ["stratify", sources["parquet"], dst, "--label", "label",
                                                      "--target", "uniform", "--mode", "online", "--num-classes", "4",
                                                      "--batch-size", "12", "--balanced-batches"])
    assert "_map" not in exchanged(engine) and "_sort_part" in exchanged(engine)


def test_an_error_in_a_map_task_reads_as_the_local_one_and_leaves_nothing(sources, run_cli, tmp_path):
    """An example too long for --max-tokens alone, found while a map task scatters: the local error, and no
    DST or exchange directory left."""
    src = str(tmp_path / "src")
    shutil.copytree(sources["parquet"], src)
    engine, stderr = fails_alike(run_cli, tmp_path, ["bucket", src, "--length", "tokens", "--boundaries", "10",
                                                      "--max-tokens", "30"])
    assert "_map" in exchanged(engine) and "exceeds --max-tokens 30" in stderr
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]


def test_a_bad_label_in_a_map_task_is_counted_over_the_whole_input(tmp_path, run_cli):
    """A label outside the classes found by a map task: the local error, every bad label counted."""
    table = make_table(300, seed=3)
    labels = table.column("label").to_numpy().copy()
    labels[[170, 260, 290]] = 9  # past the first row group, which the probe reads
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))
    src = write_parquet_shards(str(tmp_path / "src"), table)
    engine, stderr = fails_alike(run_cli, tmp_path, ["stratify", src, "--label", "label", "--target", "uniform",
                                                      "--num-classes", "4", "--mode", "bernoulli", "--init-probs",
                                                      "0.25,0.25,0.25,0.25", "--batch-size", "8",
                                                      "--balanced-batches"])
    assert "_map" in exchanged(engine) and "3 " in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]
