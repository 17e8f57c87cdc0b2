"""shuffle: an exact permutation independent of threads and --memory, bounded memory, the buffered parity mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memlimit import HANG_GUARD
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core import rng
from batchtool.exec import exchange
from batchtool.io.dataset import Chunk
from batchtool.core.errors import OptionError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.rows import rebatch
from batchtool.ops.shuffle import OP, STAGE, ShuffleOptions, buffered_shuffle
from batchtool.io.output import OutputOptions
from batchtool.pipeline.config import load
from batchtool.pipeline.execute import run_pipeline
from batchtool.core.synthetic import make_table
from conftest import REPO, data_bytes, read_dir, write_parquet_shards

SCHEMA = pa.schema([("x", pa.int64())])


def run(src, dst, threads: int = 2, seed: int = 0, memory: int | None = None, **options):
    return run_operation(OP, ShuffleOptions(**options), src, str(dst), OutputOptions(),
                         RunSettings(threads=threads, quiet=True, memory=memory), seed=seed)


def test_key_ranges_shrink_with_threads_and_change_no_byte(tmp_path, parquet_src, monkeypatch):
    """Each of --threads sorts a key range of its own at once, so a range's share of --memory is divided by them:
    four threads sort four times as many ranges, and write the same bytes."""
    ranges: list[int] = []
    sort_groups = exchange.sort_groups

    def counted(job, rows, executor, held=None):
        ranges.append(sum(len(parts) for parts in rows))
        return sort_groups(job, rows, executor, held)

    monkeypatch.setattr(exchange, "sort_groups", counted)
    run(parquet_src, tmp_path / "one", threads=1, memory=400_000)
    run(parquet_src, tmp_path / "four", threads=4, memory=400_000)
    assert 1 < ranges[0] and 4 * ranges[0] - 4 <= ranges[1] <= 4 * ranges[0]
    assert data_bytes(str(tmp_path / "one")) == data_bytes(str(tmp_path / "four"))


def chunks_of(sizes: list[int]) -> list[Chunk]:
    out, start = [], 0
    for size in sizes:
        out.append(Chunk(pa.record_batch({"x": np.arange(start, start + size)}), rng.example_ids(0, start, size)))
        start += size
    return out


def keys(path) -> list[str]:
    return read_dir(str(path)).column("key").to_pylist()


def test_global_shuffle_is_a_permutation_that_ignores_threads_and_memory(tmp_path, parquet_src, corpus):
    run(parquet_src, tmp_path / "a", threads=1)
    result = run(parquet_src, tmp_path / "b", threads=4, memory=20_000)
    run(parquet_src, tmp_path / "c", seed=1)
    a = read_dir(str(tmp_path / "a"))
    assert a.equals(read_dir(str(tmp_path / "b")))
    assert sorted(a.to_pylist(), key=lambda r: r["key"]) == corpus.to_pylist()
    assert keys(tmp_path / "a") != keys(tmp_path / "c")
    assert keys(tmp_path / "a") != corpus.column("key").to_pylist()


@pytest.mark.parametrize("batch_size, drop", [(64, False), (64, True), (1, False)])
def test_batch_size_sets_row_groups(tmp_path, parquet_src, batch_size, drop):
    result = run(parquet_src, tmp_path / "out", batch_size=batch_size, drop_remainder=drop)
    groups = [g.num_rows for f in sorted((tmp_path / "out").glob("part-*"))
              for g in (pq.ParquetFile(f).metadata.row_group(i) for i in range(pq.ParquetFile(f).num_row_groups))]
    assert all(g == batch_size for g in groups[:-1])
    assert sum(groups) == (300 // batch_size * batch_size if drop else 300)
    assert result.manifest["stats"]["examples_dropped"] == 300 - sum(groups)


def reference_buffered(n: int, capacity: int, seed: int) -> list[int]:
    """shuffle_batch's queue as documented, one row at a time."""
    def u(t: int) -> float:
        return float(rng.uniform(seed, STAGE + "/buffer", np.array([t], dtype=np.uint64))[0])

    slots, out = list(range(min(capacity, n))), []
    for row in range(capacity, n):
        slot = int(u(len(out)) * capacity)
        out.append(slots[slot])
        slots[slot] = row
    while slots:
        slot = int(u(len(out)) * len(slots))
        out.append(slots[slot])
        slots[slot] = slots[-1]
        slots.pop()
    return out


@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(1, 60), st.integers(0, 5))
@settings(max_examples=40, deadline=None)
def test_buffered_shuffle_matches_the_reference_for_any_chunking(sizes, capacity, seed):
    chunks = chunks_of(sizes)
    out = [v for c in buffered_shuffle(chunks, capacity, seed, SCHEMA) for v in c.data.column("x").to_pylist()]
    assert out == reference_buffered(sum(sizes), capacity, seed)


def test_buffered_mixing_is_local(tmp_path):
    """With capacity C, output position t holds an input row below t + C: shuffle_batch's mixing is local."""
    out = [v for c in buffered_shuffle(chunks_of([500] * 4), 100, 0, SCHEMA) for v in c.data.column("x").to_pylist()]
    assert sorted(out) == list(range(2000))
    assert all(v < t + 100 for t, v in enumerate(out))


def test_buffered_cli_path_and_default_capacity(tmp_path, parquet_src, corpus):
    result = run(parquet_src, tmp_path / "out", min_after_dequeue=20, batch_size=10)
    assert result.manifest["stats"]["capacity"] == 30 and result.manifest["stats"]["mode"] == "buffered"
    out = keys(tmp_path / "out")
    positions = {k: i for i, k in enumerate(corpus.column("key").to_pylist())}
    assert [positions[k] for k in out] == reference_buffered(300, 30, 0)


@given(st.lists(st.integers(0, 30), min_size=0, max_size=10), st.integers(1, 25), st.booleans())
@settings(max_examples=60, deadline=None)
def test_rebatch_keeps_rows_and_cuts_exact_batches(sizes, size, drop):
    batches = list(rebatch(chunks_of(sizes), size, SCHEMA, drop))
    rows = [v for b in batches for v in b.data.column("x").to_pylist()]
    total = sum(sizes)
    assert rows == list(range(total // size * size if drop else total))
    assert all(b.num_rows == size for b in batches[:-1]) and all(0 < b.num_rows <= size for b in batches)
    assert all(np.array_equal(b.ids, rng.example_ids(0, b.data.column("x")[0].as_py(), b.num_rows)) for b in batches)


@pytest.mark.parametrize("kwargs, message", [
    ({"drop_remainder": True}, "--drop-remainder needs --batch-size"),
    ({"buffer": 10, "min_after_dequeue": 10}, "--min-after-dequeue 10 must be smaller than --buffer 10"),
    ({"buffer": 0}, "--buffer 0"),
    ({"min_after_dequeue": -1}, "--min-after-dequeue -1: must be >= 0"),
    ({"batch_size": 0}, "--batch-size 0"),
])
def test_option_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ShuffleOptions(**kwargs)


def test_memory_is_a_run_setting_named_in_each_vocabulary():
    with pytest.raises(OptionError) as caught:
        RunSettings(memory=0)
    assert caught.value.rendered("cli").startswith("--memory 0: must be a positive size")
    assert caught.value.rendered("toml").startswith("key 'memory' = 0: must be a positive size")


CHILD = """
import json, sys
import pyarrow as pa
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.shuffle import OP, ShuffleOptions
from batchtool.io.output import OutputOptions

def status():
    return {k: int(v.split()[0]) * 1024 for k, v in
            (line.split(":", 1) for line in open("/proc/self/status")) if k in ("VmRSS", "VmHWM")}

def run(src, dst):
    run_operation(OP, ShuffleOptions(), src, dst, OutputOptions(),
                  RunSettings(threads=2, quiet=True, memory=int(sys.argv[3])))

run(sys.argv[4], sys.argv[2] + "-warmup")  # lazy imports, thread stacks, reader state: not data
before = status()["VmRSS"]
run(sys.argv[1], sys.argv[2])
print(json.dumps({"before": before, "peak": status()["VmHWM"], "arrow_peak": pa.default_memory_pool().max_memory()}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_peak_memory_stays_bounded_on_data_many_times_the_budget(tmp_path):
    """~130 MB of Arrow data (40 MB of Parquet) through an 8 MB budget: the process grows by a few times
    the budget (a spill part read back, spill buffers, 2 x threads + 1 input row groups of ~1 MB being
    read), not by the data size; measured about 2.7 x the budget, Arrow's own peak about 1.9 x.
    mimalloc is told to return freed pages at once, so RSS shows what the algorithm holds rather than
    the allocator's cache."""
    table = make_table(14_000, seed=1, median_length=100, max_length=600, frame_dim=16)
    src = write_parquet_shards(str(tmp_path / "src"), table, shards=4, row_group_size=100)
    tiny = write_parquet_shards(str(tmp_path / "tiny"), table.slice(0, 100), shards=1)
    memory = 8 << 20
    env = dict(os.environ, PYTHONPATH=REPO, MIMALLOC_PURGE_DELAY="0", MIMALLOC_ARENA_EAGER_COMMIT="0")
    proc = subprocess.run([sys.executable, "-c", CHILD, src, str(tmp_path / "out"), str(memory), tiny], env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)
    growth = measured["peak"] - measured["before"]
    assert table.nbytes > 12 * memory
    assert growth < 4 * memory, measured
    assert measured["arrow_peak"] < 3 * memory, measured
    assert read_dir(str(tmp_path / "out")).num_rows == 14_000


def test_a_buffered_shuffle_in_a_pipeline_writes_the_bytes_of_the_cli_chain(tmp_path, parquet_src, run_cli):
    """The buffered shuffle regroups as it streams: a stage after it whose passes read it twice (stratify's
    counts, then its thresholds) gets the same order each time, and the output is the two commands' output."""
    (tmp_path / "p.toml").write_text(f'seed = 4\n[input]\npath = "{parquet_src}"\n[[stage]]\nop = "shuffle"\n'
                                     'buffer = 40\n[[stage]]\nop = "stratify"\ntarget = "uniform"\n'
                                     '[output]\npath = "out"\n')
    assert run_cli("run", tmp_path / "p.toml", "-q").exit_code == 0
    assert run_cli("shuffle", parquet_src, tmp_path / "s", "--buffer", "40", "--seed", "4", "-q").exit_code == 0
    assert run_cli("stratify", tmp_path / "s", tmp_path / "chain", "--target", "uniform", "--seed", "4",
                   "-q").exit_code == 0
    assert data_bytes(str(tmp_path / "out")) == data_bytes(str(tmp_path / "chain"))
    shuffled = json.load(open(tmp_path / "out" / ".batchtool_manifest.json"))["stats"]["stages"][0]
    assert (shuffled["mode"], shuffled["capacity"], shuffled["rows_in"], shuffled["rows_out"]) == \
        ("buffered", 40, 300, 300)


@pytest.mark.parametrize("drop, rows_out, batches", [(False, 300, 5), (True, 256, 4)])
def test_dry_run_says_the_batches_a_shuffle_would_write(tmp_path, parquet_src, drop, rows_out, batches):
    (tmp_path / "p.toml").write_text(f'[input]\npath = "{parquet_src}"\n[[stage]]\nop = "shuffle"\nbuffer = 10\n'
                                     f'[[stage]]\nop = "shuffle"\nbatch-size = 64\ndrop-remainder = {str(drop).lower()}'
                                     '\n[output]\npath = "out"\n')
    first, last = run_pipeline(load(str(tmp_path / "p.toml")), RunSettings(quiet=True), dry_run=True).stages
    assert (first["rows_in"], first["rows_out"]) == (300, 300)
    assert (last["rows_in"], last["rows_out"], last["batches"]) == (300, rows_out, batches)
    assert not (tmp_path / "out").exists()


