"""bucket over two lengths from the command line: one-line errors, inspect's grid, and check's max_batch_cost and
per-cell padding rules on its output."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest

from conftest import data_bytes, write_parquet_shards


@pytest.fixture(scope="module")
def grid_src(tmp_path_factory) -> str:
    """Speech-like rows: input lengths lognormal, output about a quarter of the input; in_len and out_len say so
    (out_len wrong in row 3 of the second shard, `bad`); labels 0, 1, 2 in turn."""
    rng = np.random.default_rng(4)
    first = np.clip(rng.lognormal(3.5, 0.5, 120), 1, 200).astype(int)
    second = np.maximum(1, first // 4 + rng.integers(-2, 3, 120))
    bad = second.copy()
    bad[63] += 1
    t = pa.table({"id": np.arange(120), "src": pa.array([[1] * a for a in first], pa.list_(pa.int16())),
                  "tgt": pa.array([[2] * b for b in second], pa.list_(pa.int16())), "in_len": first,
                  "out_len": second, "bad_len": bad, "label": np.arange(120) % 3})
    return write_parquet_shards(str(tmp_path_factory.mktemp("grid") / "src"), t, shards=2, row_group_size=20)


GRID = ["--length", "in_len", "--length", "out_len", "--sequence", "src", "--sequence", "tgt", "--auto-buckets", "6"]


@pytest.mark.parametrize("args, message", [
    (["--length", "in_len", "--length", "out_len", "--sequence", "src", "--auto-buckets", "4", "--batch-size", "4"],
     "--sequence src: 1 --sequence columns for 2 --length columns"),
    (["--length", "in_len", "--length", "out_len", "--auto-buckets", "4", "--batch-size", "4"],
     "--sequence none: 0 sequence columns for 2 --length columns"),
    (["--length", "in_len,out_len,id", "--sequence", "src", "--auto-buckets", "4", "--batch-size", "4"],
     "3 lengths given"),
    ([*GRID, "--batch-size", "4", "--balance", "label", "--order", "sorted"], "--balance with --order sorted"),
    ([*GRID, "--batch-size", "4", "--balance", "label", "--target", "0.5,0.5"],
     r"--balance label: labels must be integers in \[0, 2\) \(--target gives 2 classes\)"),
    ([*GRID, "--batch-size", "4", "--mask"], "--mask is not available with two --length"),
    (["--length", "in_len", "--length", "out_len", "--sequence", "src", "--sequence", "tgt", "--boundaries", "9",
      "--batch-size", "4"], "--boundaries is not available with two --length"),
    ([*GRID, "--max-tokens", "99", "--cost-coefficients", "1,-1,0"], "non-negative"),
    ([*GRID, "--max-tokens", "30"], r"part-00000.parquet, row \d+: an example of lengths \d+ x \d+ padded to"),
    (["--length", "in_len", "--length", "bad_len", "--sequence", "src", "--sequence", "tgt", "--auto-buckets", "4",
      "--batch-size", "4"], "part-00001.parquet, row 3: column 'bad_len' says length"),
])
def test_grid_errors_exit_2_with_one_line(tmp_path, grid_src, run_cli, args, message):
    result = run_cli("bucket", grid_src, tmp_path / "dst", *args, "-q")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert not os.path.exists(tmp_path / "dst")


def test_grid_run_inspect_and_check(tmp_path, grid_src, run_cli):
    dst = tmp_path / "out"
    result = run_cli("bucket", grid_src, dst, *GRID, "--max-tokens", "600")
    assert result.exit_code == 0, result.stderr
    stats = json.loads((dst / ".batchtool_manifest.json").read_text())["stats"]
    first = ",".join(map(str, stats["boundaries"][0]))
    assert re.search(rf"auto-buckets: {sum(stats['grid'])} cells, first length {first}, second length per "
                     r"first-length bucket .* \(-: not cut\); expected padding efficiency [\d.]+%; largest batch cost",
                     result.stderr), result.stderr
    assert 0 < stats["max_batch_cost"] <= 600 and sum(stats["grid"]) <= 6
    shown = run_cli("inspect", dst).output
    assert f"cells ({sum(stats['grid'])} over two lengths in {len(stats['grid'])} first-length buckets" in shown
    assert "rows (efficiency) per cell: a line per first-length bucket, its second-length buckets across" in shown
    worst = min(c["padding_efficiency"] for c in stats["buckets"] if c["examples"])
    rules = tmp_path / "rules.toml"
    for cost, efficiency, code in ((600, worst, 0), (stats["max_batch_cost"] - 1, worst + 0.001, 1)):
        rules.write_text(f"[[rules]]\nkind = \"max_batch_cost\"\nmax = {cost}\n[[rules]]\nkind = "
                         f"\"padding_efficiency\"\nmin = {efficiency}\nper_bucket = true\n")
        checked = run_cli("check", dst, "--rules", rules)
        assert checked.exit_code == code, checked.output + checked.stderr
    assert re.search(r"FAIL max_batch_cost: largest \d+ \(cell \d,\d \(lengths \d+-\d* x \d+-\d*\)\)", checked.output)


def test_same_bytes_for_one_thread_and_the_process_engine_in_little_memory(tmp_path, grid_src, run_cli):
    args = [*GRID, "--max-tokens", "600", "-q"]
    assert run_cli("bucket", grid_src, tmp_path / "a", *args, "--threads", "1").exit_code == 0
    assert run_cli("bucket", grid_src, tmp_path / "b", *args, "--engine", "processes", "--threads", "2", "--memory",
                   "64MB").exit_code == 0
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))


def test_max_batch_cost_on_a_one_length_output_is_a_usage_error(tmp_path, grid_src, run_cli):
    dst = tmp_path / "one"
    assert run_cli("bucket", grid_src, dst, "--sequence", "src", "--auto-buckets", "3", "--batch-size", "4",
                   "-q").exit_code == 0
    rules = tmp_path / "rules.toml"
    rules.write_text("[[rules]]\nkind = \"max_batch_cost\"\nmax = 10\n")
    checked = run_cli("check", dst, "--rules", rules)
    assert checked.exit_code == 2 and "records no stats.max_batch_cost" in checked.stderr


def test_balanced_grid_batches_and_the_same_bytes_for_any_threads_memory_and_engine(tmp_path, grid_src, run_cli):
    args = [*GRID, "--max-tokens", "600", "--balance", "label", "--target", "0.5,0.25,0.25", "-q"]
    dst = tmp_path / "a"
    assert run_cli("bucket", grid_src, dst, *args, "--threads", "1", "--memory", "1GB").exit_code == 0
    stats = json.loads((dst / ".batchtool_manifest.json").read_text())["stats"]
    out = pa.ipc.open_file(str(dst / "part-00000.arrow")).read_all()
    rows = [cell["batch_rows"] for cell in stats["buckets"]]
    batch, labels, cells = (out.column(c).to_numpy() for c in ("batch", "label", "bucket"))
    full = 0
    for b in np.unique(batch):
        at = batch == b
        cell = int(cells[at][0])
        assert (cells[at] == cell).all()
        if at.sum() == rows[cell]:  # a full batch holds each class's exact quota (a half, a quarter, a quarter)
            full += 1
            counts = np.bincount(labels[at], minlength=3)
            assert abs(counts[0] - rows[cell] / 2) <= 0.5 and abs(counts[1] - counts[2]) <= 1, counts
    assert full and 0 < stats["max_batch_cost"] <= 600 and stats["examples_dropped"]["unbalanced"] > 0
    for name, more in (("b", ["--threads", "2", "--memory", "256KB"]),
                       ("c", ["--engine", "processes", "--threads", "2"])):
        assert run_cli("bucket", grid_src, tmp_path / name, *args, *more).exit_code == 0
        assert data_bytes(str(tmp_path / name)) == data_bytes(str(dst))
