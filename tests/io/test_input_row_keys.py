"""The example index's keys without a key column: each example's row in the input (rows counted from 0 across the
input's files in the order batchtool reads them; `SOURCE:ROW` in a mix), carried from the read through the op to the
index, whatever writes it; outputs indexed before by output position still answer as they did."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import invoke_cli

import batchtool
from batchtool.io.example_index import INDEX_NAME

MANIFEST = ".batchtool_manifest.json"


def _source(directory: str, files: int = 2, rows: int = 5, first: int = 0) -> str:
    """`files` Parquet files of `rows` rows whose `row` column is each row's number in the input: what its key must be."""
    os.makedirs(directory)
    for f in range(files):
        row = np.arange(first + f * rows, first + (f + 1) * rows)
        tokens = [list(range(int(r) % 4 + 1)) for r in row]
        pq.write_table(pa.table({"row": row - first, "tokens": tokens, "label": (row % 2).astype(np.int64),
                                 "odd": row % 2 == 1}),
                       os.path.join(directory, f"part-{f}.parquet"), row_group_size=3)
    return directory


def _cli(*args: object) -> str:
    result = invoke_cli(*args)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _steps(dst: str) -> list[list[str]]:
    """`batchtool step DST N` of every step of epoch 0."""
    steps = len(list(batchtool.load(dst)))
    return [_cli("step", dst, n).split() for n in range(steps)]


def _loaded(dst: str, column: str = "row") -> list[list[str]]:
    """The loader's batches' values of `column` (flattened: a packed row's documents in order), as strings."""
    out = []
    for batch in batchtool.load(dst):
        values = batch[column]
        out.append([str(v) for row in values for v in (row if isinstance(row, (list, np.ndarray)) else [row])])
    return out


def _index(dst: str) -> dict:
    with open(os.path.join(dst, MANIFEST)) as f:
        return json.load(f)["output"]["index"]


def _receipts_check(dst: str, tmp_path) -> tuple[str, list[int]]:
    """`check --receipts --exactly-once` passes a receipt of epochs 0 and 1; on one missing epoch 0's second step,
    what it says, and that step's keys."""
    log = str(tmp_path / "receipt.log")
    for epoch in (0, 1):
        loader = batchtool.load(dst, receipt=log)
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    lines = open(log).read().splitlines(keepends=True)
    dropped = str(tmp_path / "dropped.log")
    open(dropped, "w").writelines(lines[:1] + lines[2:])
    whole = invoke_cli("check", dst, "--receipts", log, "--exactly-once")
    assert whole.exit_code == 0, whole.stdout + whole.stderr
    missing = invoke_cli("check", dst, "--receipts", dropped, "--exactly-once")
    assert missing.exit_code == 1
    return missing.stdout + missing.stderr, [int(k) for k in _cli("step", dst, 1).split()]


@pytest.mark.parametrize("command", [
    ("bucket", "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens"),
    ("pack", "--max-length", "5", "--sequence", "tokens", "--batch-size", "2"),
    ("stratify", "--target", "uniform", "--batch-size", "3", "--balanced-batches"),
    ("stratify", "--target", "uniform", "--batch-size", "3"),
    ("shuffle", "--batch-size", "3"),
    ("shuffle", "--batch-size", "3", "--buffer", "4"),
], ids=["bucket", "pack", "stratify-balanced", "stratify-plain", "shuffle-global", "shuffle-buffered"])
def test_each_steps_keys_are_its_examples_input_rows(tmp_path, command):
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli(command[0], src, dst, *command[1:], "--seed", "3", "--quiet")
    assert _index(dst)["key"] is None and _index(dst)["rows"] == "input"
    steps = _steps(dst)
    assert steps == _loaded(dst)
    if command[0] != "stratify":  # every row once (stratify's selection drops some)
        assert sorted(int(k) for keys in steps for k in keys) == list(range(10))


def test_pack_keys_every_piece_of_a_split_document_by_its_row(tmp_path):
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("pack", src, dst, "--max-length", "2", "--sequence", "tokens", "--split-long", "--seed", "1", "--quiet")
    steps = _steps(dst)
    assert steps == _loaded(dst)
    lengths = [int(r) % 4 + 1 for r in range(10)]
    assert sorted(int(k) for keys in steps for k in keys) == sorted(r for r in range(10)
                                                                    for _ in range(-(-lengths[r] // 2)))


def test_mix_keys_are_source_and_row(tmp_path):
    first = _source(str(tmp_path / "a"), files=2, rows=4)
    second = _source(str(tmp_path / "b"), files=1, rows=6, first=100)
    dst = str(tmp_path / "dst")
    _cli("mix", first, second, dst, "--weights", "1,1", "--batch-size", "4", "--seed", "2", "--quiet")
    assert _index(dst)["rows"] == "input"
    steps = _steps(dst)
    sources, rows = _loaded(dst, "source"), _loaded(dst, "row")
    assert steps == [[f"{s}:{r}" for s, r in zip(ss, rr)] for ss, rr in zip(sources, rows)]
    assert _cli("where", dst, steps[0][0]).startswith("step 0 ")


def test_the_index_is_the_same_bytes_for_any_threads_memory_and_engine(tmp_path):
    src = _source(str(tmp_path / "src"), files=3, rows=40)
    written = []
    for i, run in enumerate([("--threads", "1"), ("--threads", "2"), ("--threads", "2", "--memory", "2MB"),
                             ("--engine", "processes", "--threads", "2")]):
        dst = str(tmp_path / f"dst{i}")
        _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "5", "--sequence", "tokens", "--seed", "4",
             "--quiet", *run)
        with open(os.path.join(dst, INDEX_NAME), "rb") as f:
            written.append(f.read())
    assert all(w == written[0] for w in written[1:])


def test_streamed_batches_spooled_on_worker_processes_keep_the_same_keys(tmp_path):
    """stratify's plain batches stream: on the process engine they are spooled, their ids with them, and written by
    the shards' tasks; the index is the one the driver's writer makes."""
    src = _source(str(tmp_path / "src"), files=2, rows=30)
    written = []
    for i, run in enumerate([("--threads", "1"), ("--engine", "processes", "--threads", "2")]):
        dst = str(tmp_path / f"dst{i}")
        _cli("stratify", src, dst, "--target", "uniform", "--batch-size", "4", "--seed", "2", "--quiet", *run)
        with open(os.path.join(dst, INDEX_NAME), "rb") as f:
            written.append(f.read())
    assert written[0] == written[1]
    assert _steps(dst) == _loaded(dst)


def test_a_key_column_named_by_key_still_wins(tmp_path):
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--key", "label",
         "--quiet")
    assert _index(dst)["key"] == "label" and "rows" not in _index(dst)
    assert _steps(dst) == _loaded(dst, "label")


def test_a_pipeline_keys_its_sources_rows_or_its_last_stages_input(tmp_path):
    src = _source(str(tmp_path / "src"))
    for name, stages, expected in [
        ("first", '[[stage]]\nop = "bucket"\nboundaries = [2]\nbatch-size = [3]\nsequence = ["tokens"]\n', "input"),
        ("later", '[[stage]]\nop = "filter"\ncolumn = "odd"\n\n[[stage]]\nop = "bucket"\nboundaries = [2]\n'
                  'batch-size = [3]\nsequence = ["tokens"]\n', "stage input")]:
        dst = str(tmp_path / name)
        config = tmp_path / f"{name}.toml"
        config.write_text(f'seed = 1\n\n[input]\npath = "{src}"\n\n[output]\npath = "{dst}"\n\n{stages}')
        _cli("run", str(config), "--quiet")
        assert _index(dst)["rows"] == expected
        steps = _steps(dst)
        if expected == "input":
            assert steps == _loaded(dst)
        else:  # the filter's output rows: the odd input rows, numbered from 0
            assert steps == [[str(int(r) // 2) for r in batch] for batch in _loaded(dst)]


def test_an_output_indexed_by_output_position_still_answers_as_before(tmp_path):
    """An output written before input rows: its manifest's index names no `rows`, its keys are output positions."""
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--quiet")
    with pa.memory_map(os.path.join(dst, INDEX_NAME)) as f:
        batches = np.array(pa.ipc.open_file(f).get_batch(0).column(1))  # a copy: the file is rewritten below
    examples = len(batches)
    positions = pa.array(np.arange(examples, dtype=np.int64))
    old = pa.record_batch([positions, pa.array(batches), positions], names=["key", "batch", "by_key"])
    with pa.OSFile(os.path.join(dst, INDEX_NAME), "wb") as sink, pa.ipc.new_file(sink, old.schema) as writer:
        writer.write_batch(old)
    with open(os.path.join(dst, MANIFEST)) as f:
        manifest = json.load(f)
    data = open(os.path.join(dst, INDEX_NAME), "rb").read()
    manifest["output"]["index"] = {"path": INDEX_NAME, "key": None, "examples": examples, "bytes": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(dst, MANIFEST), "w") as f:
        json.dump(manifest, f)
    steps = _steps(dst)
    assert sorted(int(k) for keys in steps for k in keys) == list(range(examples))
    for keys in steps:  # a step's keys are one batch's output positions, in order
        assert len({int(batches[int(k)]) for k in keys}) == 1
        assert [int(k) for k in keys] == list(range(int(keys[0]), int(keys[0]) + len(keys)))
    assert _cli("where", dst, steps[1][0]).startswith("step 1 ")
    result = invoke_cli("where", dst, "x")
    assert result.exit_code == 2 and "row numbers in the output" in result.stderr
    missing, keys = _receipts_check(dst, tmp_path)
    assert keys == [int(k) for k in steps[1]] and f"example {keys[0]!r} (batch " in missing


def test_tfrecord_files_are_counted_to_number_the_rows_after_them(tmp_path):
    src = _source(str(tmp_path / "src"), files=3, rows=4)
    records = str(tmp_path / "records")
    os.makedirs(records)
    for f in range(3):  # one TFRecord file of each Parquet file's rows, in the same order
        _cli("convert", os.path.join(src, f"part-{f}.parquet"), str(tmp_path / f"r{f}"), "--to", "tfrecord",
             "--quiet")
        os.replace(tmp_path / f"r{f}" / "part-00000.tfrecord", os.path.join(records, f"part-{f}.tfrecord"))
    dst = str(tmp_path / "dst")
    _cli("bucket", records, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--seed", "5",
         "--quiet")
    steps = _steps(dst)
    assert steps == _loaded(dst)
    assert sorted(int(k) for keys in steps for k in keys) == list(range(12))


@pytest.mark.parametrize("renamed", [(), ("--output-column", "key=segment_key")])
def test_segment_is_keyed_by_its_key_column_under_any_name(tmp_path, renamed):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(6)], "tokens": [list(range(i + 1)) for i in range(6)]}),
                   tmp_path / "src" / "part-0.parquet")
    dst = str(tmp_path / "dst")
    _cli("segment", str(tmp_path / "src"), dst, "--key", "id", "--sequence", "tokens", "--num-unroll", "2",
         "--batch-size", "2", "--quiet", *renamed)
    column = renamed[1].split("=")[1] if renamed else "key"
    assert _index(dst)["key"] == column and "rows" not in _index(dst)
    steps = _steps(dst)
    assert steps[0] and all(k.split(":")[1].startswith("doc-") for keys in steps for k in keys)


_CARRIED_GROWTH = """
import json, os, sys
import numpy as np
from batchtool.io import example_index
from batchtool.io.workspace import Workspace
dst, memory, scratch, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
manifest = json.load(open(os.path.join(dst, ".batchtool_manifest.json")))
manifest["output"].pop("index")
batches = manifest["output"]["batches"]
carried = os.path.join(scratch, "carried")
os.makedirs(carried)
counts = np.full(batches, n // batches, dtype=np.int64)
counts[-1] += n - counts.sum()
counts.tofile(os.path.join(carried, "counts"))
np.random.default_rng(0).permutation(n).astype(np.uint64).tofile(os.path.join(carried, "ids"))
del counts
def build():
    return example_index.build_index(dst, manifest, Workspace(scratch, dst), memory, None,
                                     example_index.Carried((carried,), example_index.InputRows(None)))
build()  # imports and caches: the build measured starts warm
def rss(field):
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(field)).split()[1]) << 10
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = rss("VmRSS:")
entry = build()
print(json.dumps({"examples": entry["examples"], "grew": rss("VmHWM:") - base}))
"""
_CARRIED = 1 << 19
"""Half a million carried ids: 4 MB of them, an index of 12 MB, which a build under the default --memory holds at
once (13 MB of growth, measured) and one under 4 MB in runs (3 MB)."""


def test_an_index_of_carried_ids_is_built_under_a_small_memory(tmp_path):
    """The ids are read from the writer's files a piece at a time and their keys sorted in runs that spill: under
    --memory 4MB the build's peak grows by a few MB, not by the index it writes."""
    import sys

    import memlimit

    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--quiet")
    os.makedirs(tmp_path / "scratch")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = memlimit.run_capped([sys.executable, "-c", _CARRIED_GROWTH, dst, str(4 << 20), str(tmp_path / "scratch"),
                                 str(_CARRIED)], 1 << 30, env={**os.environ, "PYTHONPATH": repo})
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["examples"] == _CARRIED
    assert result["grew"] < 8 << 20, result["grew"] >> 20


def test_check_receipts_names_a_missing_batch_by_its_first_input_row(tmp_path):
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--quiet")
    missing, keys = _receipts_check(dst, tmp_path)
    assert f"example {keys[0]!r} (batch " in missing and "was never handed out" in missing
    assert keys == [int(r) for r in _loaded(dst)[1]]


def test_a_manifest_naming_other_rows_is_refused_in_one_line(tmp_path):
    src = _source(str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    _cli("bucket", src, dst, "--boundaries", "2", "--batch-size", "3", "--sequence", "tokens", "--quiet")
    with open(os.path.join(dst, MANIFEST)) as f:
        manifest = json.load(f)
    manifest["output"]["index"]["rows"] = "output"
    with open(os.path.join(dst, MANIFEST), "w") as f:
        json.dump(manifest, f)
    result = invoke_cli("step", dst, 0)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {os.path.join(dst, MANIFEST)}: output.index.rows is "
                                                  "'output': expected 'input' or 'stage input'"]
