"""Two identical runs write manifests that differ only in their `run` section (times, memory, threads)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import write_parquet_shards

from batchtool.io.manifest import MANIFEST_NAME
from batchtool.core.synthetic import make_table

PIPELINE = """
seed = 3
memory = "200KB"
[input]
path = "{src}"
[[stage]]
op = "stratify"
label = "label"
target = "uniform"
mode = "bernoulli"
[[stage]]
op = "shuffle"
[[stage]]
op = "bucket"
auto-buckets = 3
batch-size = 8
[output]
path = "{dst}"
"""

COMMANDS = {
    "convert": ["convert", "{src}", "{dst}", "--to", "tfrecord"],
    "stratify": ["stratify", "{src}", "{dst}", "--target", "uniform", "--mode", "bernoulli", "--seed", "4"],
    "resample": ["resample", "{src}", "{dst}", "--rate", "1.5", "--seed", "4"],
    "shuffle": ["shuffle", "{src}", "{dst}", "--memory", "100KB"],
    "bucket": ["bucket", "{src}", "{dst}", "--auto-buckets", "3", "--batch-size", "8", "--memory", "100KB"],
    "segment": ["segment", "{src}", "{dst}", "--key", "key", "--sequence", "tokens", "--num-unroll", "8",
                "--batch-size", "4"],
    "run": ["run", "{pipeline}"],
}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    return write_parquet_shards(str(tmp_path_factory.mktemp("src") / "src"), make_table(120, seed=11))


def run_twice(run_cli, tmp_path, src: str, name: str, dsts: tuple[str, str]) -> list[dict]:
    manifests = []
    for i, dst in enumerate(dsts):
        pipeline = tmp_path / f"pipeline-{os.path.basename(dst)}.toml"
        pipeline.write_text(PIPELINE.format(src=src, dst=dst))
        args = [a.format(src=src, dst=dst, pipeline=pipeline) for a in COMMANDS[name]]
        result = run_cli(*args, "--threads", str(i + 1), "-q", "--overwrite")
        assert result.exit_code == 0, result.stderr
        with open(os.path.join(dst, MANIFEST_NAME)) as f:
            manifests.append(json.load(f))
    return manifests


@pytest.mark.parametrize("name", COMMANDS)
def test_only_the_run_section_differs_between_identical_runs(src, tmp_path, run_cli, name):
    """Same command into the same DST (with --overwrite), on 1 then 2 threads."""
    dst = str(tmp_path / "dst")
    first, second = run_twice(run_cli, tmp_path, src, name, (dst, dst))
    assert first["run"]["threads"] == 1 and second["run"]["threads"] == 2
    assert "wall_seconds" in first["run"] and "wall_seconds" not in json.dumps(first["stats"])
    first.pop("run"), second.pop("run")
    assert first == second


@pytest.mark.parametrize("name", COMMANDS)
def test_a_manifest_does_not_record_where_dst_is(src, tmp_path, run_cli, name):
    """Input paths are absolute (where the data came from); DST's own path is nowhere in its manifest,
    so the same output written to two places has the same manifest, up to `run`."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    first, second = run_twice(run_cli, tmp_path, src, name, (a, b))
    assert all(os.path.isabs(f["path"]) for f in first["inputs"]["files"])
    first.pop("run"), second.pop("run")
    if name == "run":  # the options of `run` are the pipeline file: they name it and its [output] path
        for m in (first, second):
            m["options"].pop("pipeline"), m["options"]["output"].pop("path")
    assert first == second
