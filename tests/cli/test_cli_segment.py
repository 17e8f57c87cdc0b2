"""End-to-end `batchtool segment`: output and manifest, identical bytes for any --threads, errors exit 2."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest
from conftest import SAMPLE, data_bytes, read_dir, write_parquet_shards

from batchtool.ops.segment import lanes
from batchtool.core.synthetic import make_table

BASE = ("--key", "key", "--num-unroll", "6", "--batch-size", "4", "-q")


def test_segment_writes_batches_and_a_manifest(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "dst"
    result = run_cli("segment", parquet_src, dst, "--sequence", "tokens,frames", "--context", "label", *BASE)
    assert result.exit_code == 0, result.output
    manifest = json.load(open(dst / ".batchtool_manifest.json"))
    stats = manifest["stats"]
    assert manifest["command"] == "segment" and manifest["options"]["num_unroll"] == 6
    assert stats["examples"] == stats["rows_in"] == 300
    assert stats["rows_out"] == stats["batches"] * 4 == read_dir(str(dst)).num_rows
    assert 0 <= stats["empty_slot_fraction"] < 0.05 and 0 < stats["padding_efficiency"] <= 1
    assert manifest["output"]["batches"] == stats["batches"]


def test_sample_data_summary_line(tmp_path, run_cli):
    result = run_cli("segment", os.path.join(SAMPLE, "parquet"), tmp_path / "dst", "--key", "key",
                     "--sequence", "tokens", "--num-unroll", "20", "--batch-size", "32")
    assert result.exit_code == 0
    assert "segments of 4,000 examples" in result.stderr and "empty slots" in result.stderr


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_threads_1_and_4_give_identical_bytes(tmp_path, run_cli, monkeypatch, to):
    src = write_parquet_shards(str(tmp_path / "src"), make_table(100, seed=8), shards=3, row_group_size=7)
    monkeypatch.setattr(lanes, "ITEM_SEGMENTS", 16)  # many work items, so threads really interleave
    for threads in (1, 4):
        result = run_cli("segment", src, tmp_path / f"t{threads}", "--sequence", "tokens,frames",
                         "--context", "label,weight", "--to", to, "--threads", threads, *BASE)
        assert result.exit_code == 0, result.output
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t4"))


def _bad_corpus(tmp_path, case: str) -> str:
    table = make_table(20, seed=1)
    if case == "duplicate":
        keys = table.column("key").to_pylist()
        keys[17] = keys[4]
        table = table.set_column(0, "key", pa.array(keys))
    if case == "colon":
        keys = table.column("key").to_pylist()
        keys[3] = "a:b"
        table = table.set_column(0, "key", pa.array(keys))
    if case == "mismatch":
        tokens = table.column("tokens").to_pylist()
        tokens[5] = tokens[5] + [1]
        table = table.set_column(3, "tokens", pa.array(tokens, pa.list_(pa.int64())))
    if case in ("too_long", "no_pad"):
        lengths = np.array([len(t) for t in table.column("tokens").to_pylist()])
        real = lengths.copy()
        if case == "too_long":
            real[2] += 1
        table = table.append_column("real", pa.array(real))
    return write_parquet_shards(str(tmp_path / "src"), table, shards=1)


@pytest.mark.parametrize(("case", "args", "message"), [
    ("duplicate", ("--sequence", "tokens"), r"duplicate key 'ex-00000004': .*row 4 and .*row 17"),
    ("colon", ("--sequence", "tokens"), r"row 3: key 'a:b' contains ':'"),
    ("ok", ("--sequence", "tokens", "--context", "we:ight"), r"--context 'we:ight': names may not contain ':'"),
    ("too_long", ("--sequence", "tokens", "--input-length", "real"), r"row 2: column 'real' is \d+, but the "
                                                                      r"sequence has \d+ steps"),
    ("no_pad", ("--sequence", "tokens", "--no-pad"), r"row \d+: column 'tokens' has \d+ steps, not a positive "
                                                     r"multiple of --num-unroll 6"),
    ("mismatch", ("--sequence", "tokens,frames"), r"row 5: sequence columns disagree in length"),
    ("ok", ("--sequence", "tokens", "--num-unroll", "0"), r"--num-unroll 0: must be at least 1"),
    ("ok", ("--sequence", "nope"), r"no column 'nope'"),
    ("ok", ("--sequence", "tokens", "--pad-value", "label=3"), r"'label' is not a --sequence column"),
    ("ok", ("--sequence", "tokens", "--world-size", "100000000"),
     r"--num-unroll 6 with --batch-size 4 and --world-size 100000000: one batch of 4 segments for each rank "
     r"\(400,000,000 in all\) padded to 6 steps takes about .* at once, more than --memory 1\.0 GB allows "
     r"\(128\.0 MB\); give a smaller --num-unroll, --batch-size or --world-size, or a larger --memory"),
    ("ok", ("--sequence", "tokens", "--output-column", "lane=key"), r"--output-column: two output columns would be "
                                                                    r"named 'key'"),
])
def test_errors_exit_2_with_one_line_and_leave_dst_untouched(tmp_path, run_cli, case, args, message):
    src = _bad_corpus(tmp_path, case)
    dst = tmp_path / "dst"
    os.makedirs(dst)
    (dst / "keep.txt").write_text("old")
    result = run_cli("segment", src, dst, *BASE, *args, "--overwrite")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert os.listdir(dst) == ["keep.txt"] and (dst / "keep.txt").read_text() == "old"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dst.tmp")]


def test_existing_dst_needs_overwrite(tmp_path, parquet_src, run_cli):
    os.makedirs(tmp_path / "dst")
    (tmp_path / "dst" / "notes.txt").write_text("kept")  # (an empty DST holds nothing to lose: it is filled)
    result = run_cli("segment", parquet_src, tmp_path / "dst", "--sequence", "tokens", *BASE)
    assert result.exit_code == 2 and "--overwrite" in result.stderr


def test_allow_small_batch_and_initial_state_flags(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "dst"
    result = run_cli("segment", parquet_src, dst, "--sequence", "tokens", "--allow-small-batch",
                     "--initial-state", "h0=weight", "--pad-value", "tokens=-1", *BASE)
    assert result.exit_code == 0, result.output
    out = read_dir(str(dst))
    assert "" not in out.column("key").to_pylist()
    first = pa.compute.equal(out.column("sequence"), 0).to_numpy(zero_copy_only=False)
    assert (out.column("h0").to_numpy()[~first] == 0).all() and (out.column("h0").to_numpy()[first] > 0).all()
    assert out.schema.field("h0").type == pa.float32()
    tokens = out.column("tokens").to_pylist()
    assert any(t[-1] == -1 for t in tokens)
