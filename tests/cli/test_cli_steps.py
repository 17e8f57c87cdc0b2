"""`batchtool where`, `batchtool step`, `--key` and `check --receipts` on the command line: exact lines, exit status
0/1/2, one error line."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import SAMPLE

import batchtool

BATCHES = os.path.join(SAMPLE, "batches")
"""sample_data/batches: the sample corpus balanced by `stratify --balanced-batches --batch-size 8`."""


def keys_yielded(dst: str, **args) -> list[list[str]]:
    return [b["key"].tolist() for b in batchtool.load(dst, columns=["key"], **args)]


def test_step_prints_the_keys_load_yields_one_a_line(run_cli):
    scan = keys_yielded(BATCHES, world_size=2, rank=1, seed=3)
    done = run_cli("step", BATCHES, 4, "--world-size", 2, "--rank", 1, "--seed", 3)
    assert done.exit_code == 0 and done.stdout == "".join(f"{k}\n" for k in scan[4])


def test_where_prints_each_step_that_hands_the_key_out(run_cli):
    key = keys_yielded(BATCHES, world_size=3, rank=2)[5][1]
    done = run_cli("where", BATCHES, key, "--world-size", 3)
    assert done.exit_code == 0
    batch = int(batchtool.load(BATCHES, world_size=3, rank=2).epoch_batches()[5])
    assert done.stdout == f"step 5 batch {batch} rank 2\n"
    assert run_cli("where", BATCHES, key, "--world-size", 3, "--rank", 0).stdout == ""


@pytest.mark.parametrize("args, status, message", [
    (("where", BATCHES, "ex-nope"), 1, f"error: {BATCHES}: no example has key 'ex-nope' (keys are its 'key' column)"),
    (("step", BATCHES, 21), 2, f"error: step 21: rank 0 of 1 has 21 steps in epoch 0 of {BATCHES} (0..20)"),
    (("step", BATCHES, 0, "--rank", 1), 2, "error: rank=1: must be in 0..0 for world_size=1"),
    (("step", os.path.join(SAMPLE, "parquet"), 0), 2, "error: "),
    (("where", "/nonexistent/out", "k"), 2, "error: /nonexistent/out: no such file or directory"),
])
def test_errors_are_one_line(run_cli, args, status, message):
    done = run_cli(*args)
    assert done.exit_code == status
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1 and done.stdout == ""


def test_an_output_without_an_index_says_so(run_cli, tmp_path):
    dst = shutil.copytree(BATCHES, str(tmp_path / "old"))
    path = os.path.join(dst, ".batchtool_manifest.json")
    manifest = json.load(open(path))
    del manifest["output"]["index"]
    json.dump(manifest, open(path, "w"))
    done = run_cli("step", dst, 0)
    assert done.exit_code == 2 and "its manifest records no example index" in done.stderr


def test_key_chooses_the_column_and_is_checked_before_writing(run_cli, tmp_path):
    dst = tmp_path / "by_label"
    done = run_cli("bucket", os.path.join(SAMPLE, "parquet"), dst, "--boundaries", "20", "--batch-size", 500,
                   "--key", "label", "--quiet")
    assert done.exit_code == 0, done.stderr
    assert run_cli("where", dst, 3).stdout.splitlines()[0].startswith("step ")
    assert run_cli("where", dst, "x").stderr.startswith("error: ") and run_cli("where", dst, "x").exit_code == 2
    bad = run_cli("bucket", os.path.join(SAMPLE, "parquet"), tmp_path / "bad", "--boundaries", "20", "--batch-size", 8,
                  "--key", "weight")
    assert bad.exit_code == 2 and "--key 'weight': the column is float" in bad.stderr
    assert not (tmp_path / "bad").exists()
    rows = run_cli("stratify", os.path.join(SAMPLE, "parquet"), tmp_path / "rows", "--label", "label",
                   "--target", "uniform", "--key", "key")
    assert rows.exit_code == 2 and "only batch output has an example index" in rows.stderr


def test_check_receipts(run_cli, tmp_path):
    log = tmp_path / "r.log"
    for _ in batchtool.load(BATCHES, receipt=log):
        pass
    done = run_cli("check", BATCHES, "--receipts", log, "--exactly-once")
    assert done.exit_code == 0 and done.stdout.startswith("PASS exactly once: 1 finished epoch(s)")
    lines = log.read_text().splitlines(keepends=True)
    (tmp_path / "short.log").write_text("".join(lines[:3] + lines[4:]))
    done = run_cli("check", BATCHES, "--receipts", tmp_path / "short.log", "--exactly-once")
    assert done.exit_code == 1 and done.stdout.startswith("FAIL example ") and "never handed out" in done.stdout
    done = run_cli("check", BATCHES, "--receipts", log, "--receipts", tmp_path / "short.log", "--same-prefix")
    assert done.exit_code == 1 and done.stdout.startswith("FAIL step 3 of epoch 0, rank 0: example ")
    for args in (("--receipts", log), ("--exactly-once",), ("--receipts", log, "--same-prefix")):
        done = run_cli("check", BATCHES, *args)
        assert done.exit_code == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
