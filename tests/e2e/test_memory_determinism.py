"""--memory never changes the output: the same data-file bytes for any budget, any --threads and any engine.

Tested as --threads is: every command that reorders through spill files (bucket, shuffle, balanced
stratify, in their default format and bucket as Parquet; a pipeline with a shuffle and a bucket, written as
Parquet and as TFRecord) runs under budgets
from 1GB down to 100KB, where the spill splits its groups into many parts, and the sha256 of every data
file must match the 1GB, one-thread run.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtool.io import spill as spill_mod
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.bucket import OP as BUCKET
from batchtool.ops.bucket import BucketOptions
from batchtool.ops.shuffle import OP as SHUFFLE
from batchtool.ops.shuffle import ShuffleOptions
from batchtool.io.output import OutputOptions
from conftest import SAMPLE, data_bytes, write_parquet_shards

BUDGETS = [("1GB", 1, "local"), ("100KB", 2, "local")]
"""(--memory, --threads, --engine); the first is the reference (budgets in between: the hypothesis test below)."""
ON_PROCESSES = ("100KB", 2, "processes")
"""The budget the process engine repeats, for one command of each kind of exchange and one pipeline: its worker
processes spill every exchange's cells (tests/e2e/test_golden_bytes.py runs it at the default budget)."""

COMMANDS = {
    "bucket": ["bucket", "--length", "tokens", "--auto-buckets", "4", "--batch-size", "16", "--mask"],
    "bucket --max-tokens": ["bucket", "--boundaries", "20,40,80", "--max-tokens", "1200", "--drop-oversize"],
    "bucket --order sorted": ["bucket", "--auto-buckets", "3", "--batch-size", "16", "--order", "sorted"],
    "bucket --to parquet": ["bucket", "--length", "tokens", "--auto-buckets", "4", "--batch-size", "16", "--mask",
                            "--to", "parquet"],
    "shuffle": ["shuffle"],
    "stratify --balanced-batches": ["stratify", "--target", "uniform", "--replacement", "--size", "2000",
                                    "--batch-size", "16", "--balanced-batches"],
}
PROCESS_COMMANDS = ("bucket", "shuffle", "stratify --balanced-batches")
"""A sort by length, a shuffle's exchange and balanced quotas: the commands run on the process engine too."""

PIPELINE = """seed = 3
memory = "{memory}"
[input]
path = "{src}"
[[stage]]
op = "shuffle"
[[stage]]
op = "stratify"
target = "uniform"
mode = "online"
num-classes = 4
[[stage]]
op = "bucket"
auto-buckets = 3
batch-size = 8
[output]
path = "{dst}"
format = "{to}"
"""


def digests(path: str) -> dict[str, str]:
    """sha256 of every data file of an output directory (the manifest's run section may differ)."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in data_bytes(path).items()}


@pytest.fixture
def most_parts(monkeypatch) -> list[int]:
    """The largest number of parts any spill group was split into during the test."""
    seen = [0]
    add = spill_mod.Spill.add

    def spy(self, chunk, groups):
        seen[0] = max(seen[0], *self.parts)
        return add(self, chunk, groups)

    monkeypatch.setattr(spill_mod.Spill, "add", spy)
    return seen


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_output_ignores_memory_and_threads(tmp_path, run_cli, most_parts, name):
    command, *args = COMMANDS[name]
    sums = []
    for memory, threads, engine in BUDGETS + ([ON_PROCESSES] if name in PROCESS_COMMANDS else []):
        dst = tmp_path / f"{memory}-{threads}-{engine}"
        result = run_cli(command, os.path.join(SAMPLE, "parquet"), dst, *args, "--memory", memory,
                         "--threads", threads, "--seed", "5", "-q", "--engine", engine)
        assert result.exit_code == 0, result.stderr
        sums.append(digests(str(dst)))
    assert sums[0] and all(s == sums[0] for s in sums[1:])
    if name != "bucket --order sorted":  # sorted splits by length ranges, not parts
        assert most_parts[0] > 1, "100KB should split a group into several spill parts"


def test_segment_and_its_key_check_ignore_memory_threads_and_engine(tmp_path, run_cli):
    """segment's bytes, and the line its key check gives for repeated keys (the first repeat by id, not by hash),
    under every budget, thread count and engine: at 100KB the search for repeats is a task per few partitions."""
    args = ("--key", "key", "--sequence", "tokens,frames", "--num-unroll", "20", "--batch-size", "8", "-q")
    table = pq.read_table(os.path.join(SAMPLE, "parquet"))
    keys = table.column("key").to_pylist()
    keys[2500], keys[3900] = keys[100], keys[1200]
    dup = write_parquet_shards(str(tmp_path / "dup"), table.set_column(0, "key", pa.array(keys)), 3, 250)
    sums, errors = [], set()
    for memory, threads, engine in [*BUDGETS, ON_PROCESSES]:
        settings = ("--memory", memory, "--threads", threads, "--engine", engine)
        dst = tmp_path / f"{memory}-{threads}-{engine}"
        result = run_cli("segment", os.path.join(SAMPLE, "parquet"), dst, *args, *settings)
        assert result.exit_code == 0, result.stderr
        sums.append(digests(str(dst)))
        failed = run_cli("segment", dup, tmp_path / "no", *args, *settings)
        assert failed.exit_code == 2 and not os.path.exists(tmp_path / "no")
        errors.add(failed.stderr)
    assert sums[0] and all(s == sums[0] for s in sums[1:])
    assert errors == {f"error: duplicate key {keys[100]!r}: {dup}/part-00000.parquet, row 100 and "
                      f"{dup}/part-00001.parquet, row 1166 (segment keys must be unique)\n"}


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_pipeline_output_ignores_memory_and_threads(tmp_path, run_cli, most_parts, to):
    """shuffle -> online stratify (which depends on the shuffle's chunks) -> bucket, written as Parquet or TFRecord."""
    sums = []
    for memory, threads, engine in BUDGETS + ([ON_PROCESSES] if to == "parquet" else []):
        dst = tmp_path / f"out-{memory}-{threads}-{engine}"
        pipeline = tmp_path / f"{memory}-{threads}-{engine}.toml"
        pipeline.write_text(PIPELINE.format(memory=memory, src=os.path.join(SAMPLE, "parquet"), dst=dst, to=to))
        result = run_cli("run", pipeline, "--threads", threads, "-q", "--engine", engine)
        assert result.exit_code == 0, result.stderr
        sums.append(digests(str(dst)))
    assert sums[0] and all(s == sums[0] for s in sums[1:])
    assert most_parts[0] > 1


@st.composite
def corpora(draw) -> tuple[pa.Table, int]:
    """A small ragged corpus (lengths 0..60, three labels) and a Parquet row-group size."""
    lengths = draw(st.lists(st.integers(0, 60), min_size=1, max_size=120))
    labels = draw(st.lists(st.integers(0, 2), min_size=len(lengths), max_size=len(lengths)))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table({"label": pa.array(labels, pa.int64()),
                      "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.arange(offsets[-1])))})
    return table, draw(st.integers(1, 40))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.integers(0, 3))
def test_any_corpus_buckets_and_shuffles_the_same_under_any_budget(corpus, seed):
    table, row_group = corpus
    quiet = [RunSettings(threads=1, quiet=True), RunSettings(threads=2, quiet=True)]
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "src"))
        pq.write_table(table, os.path.join(tmp, "src", "part-0.parquet"), row_group_size=row_group)
        for op, options in (("bucket", BucketOptions(boundaries=(5, 20), batch_size=(4,))),
                            ("shuffle", ShuffleOptions(batch_size=7))):
            sums = []
            for i, memory in enumerate((1 << 30, 2 << 10, 300)):
                dst = os.path.join(tmp, f"{op}-{memory}")
                src = os.path.join(tmp, "src")
                run_operation(BUCKET if op == "bucket" else SHUFFLE, options, src, dst, OutputOptions(),
                              replace(quiet[i % 2], memory=memory), seed=seed)
                sums.append(digests(dst))
            assert all(s == sums[0] for s in sums[1:]), op
