"""stratify, resample and shuffle from the command line: errors exit 2 leaving DST alone, same bytes for any threads."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from conftest import data_bytes, read_dir, write_parquet_shards

import batchtool


@pytest.fixture
def bad_values_src(tmp_path) -> str:
    """Rows with a NaN rate, a probability above 1 and a label outside [0, 2)."""
    table = pa.table({"key": ["a", "b", "c", "d"], "label": [0, 1, 3, 1], "rate": [1.0, float("nan"), 2.0, 1.0],
                      "p": [0.5, 0.5, 0.5, 1.25]})
    return write_parquet_shards(str(tmp_path / "bad"), table, shards=1)


def error_cases(src: str, bad: str) -> list[tuple[list, str]]:
    return [
        (["stratify", src, "DST", "--target", "0.5,0.6"], "sum to 1.1, expected 1 (tolerance 1e-06)"),
        (["stratify", src, "DST", "--target", "1.2,-0.2"], "probabilities must be >= 0 (value 1 is -0.2)"),
        (["stratify", src, "DST", "--target", "uniform", "--mode", "bernoulli", "--init-probs", "0.5,0.4,0.05,0"],
         "--init-probs 0.5,0.4,0.05,0: probabilities sum to 0.95"),
        (["stratify", src, "DST", "--target", "uniform", "--mode", "bernoulli", "--init-probs", "0.5,0.5,0,0"],
         "class 2 has initial probability 0 (--init-probs) but --target gives it 0.25"),
        (["stratify", src, "DST", "--target", "0.5,0.5"], "label(s) are not integers in [0, 2) (first: "),
        (["stratify", bad, "DST", "--target", "0.5,0.5", "--mode", "online"],
         "column 'label': 1 label(s) are not integers in [0, 2) (first: "),
        (["stratify", src, "DST", "--target", "uniform", "--label", "weight"], "label(s) are not integers"),
        (["stratify", src, "DST", "--target", "uniform", "--label", "key"], "column 'key': type string"),
        (["stratify", src, "DST", "--target", "uniform", "--label", "nope"],
         "--label: no column 'nope' in the input (columns: key"),
        (["stratify", src, "DST", "--target", "uniform", "--mode", "online"], "needs --num-classes"),
        (["stratify", src, "DST", "--target", "uniform", "--balanced-batches"],
         "--balanced-batches needs --batch-size"),
        (["resample", src, "DST"], "give exactly one of --rate"),
        (["resample", src, "DST", "--rate", "-1"], "--rate -1.0: must be a finite rate >= 0"),
        (["resample", bad, "DST", "--rate", "rate"], "row 1, column 'rate': rate nan"),
        (["resample", bad, "DST", "--accept-prob", "p"], "row 3, column 'p': acceptance probability 1.25"),
        (["resample", src, "DST", "--weight", "weight"], "--weight and --overall-rate go together"),
        (["resample", src, "DST", "--weight", "nope", "--overall-rate", "1"], "no column 'nope'"),
        (["shuffle", src, "DST", "--buffer", "5", "--min-after-dequeue", "10"], "must be smaller than --buffer 5"),
        (["shuffle", src, "DST", "--drop-remainder"], "--drop-remainder needs --batch-size"),
    ]


def test_errors_exit_2_with_one_line_and_leave_dst_as_it_was(tmp_path, parquet_src, bad_values_src, run_cli):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "precious").write_text("x")
    for args, message in error_cases(parquet_src, bad_values_src):
        args = [dst if a == "DST" else a for a in args] + ["--overwrite"]
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, result.stderr)
        assert os.listdir(dst) == ["precious"]
    assert sorted(os.listdir(tmp_path)) == ["bad", "dst", "src"]


def test_missing_dst_stays_missing_after_an_error(tmp_path, parquet_src, run_cli):
    result = run_cli("stratify", parquet_src, tmp_path / "new", "--target", "0.25,0.25,0.25,0.30")
    assert result.exit_code == 2 and not (tmp_path / "new").exists()


COMMANDS = {
    "stratify-exact": ["stratify", "--target", "uniform"],
    "stratify-online": ["stratify", "--target", "0.4,0.3,0.2,0.1", "--mode", "online"],
    "stratify-balanced": ["stratify", "--target", "uniform", "--replacement", "--batch-size", "12",
                          "--balanced-batches", "--memory", "50KB"],
    "resample-weighted": ["resample", "--weight", "weight", "--overall-rate", "1.5"],
    "resample-running": ["resample", "--weight", "weight", "--overall-rate", "1.5", "--running-mean", "--warmup", "2"],
    "resample-accept": ["resample", "--accept-prob", "weight_p"],
    "shuffle-global": ["shuffle", "--memory", "30KB", "--batch-size", "32"],
    "shuffle-buffered": ["shuffle", "--buffer", "40"],
}


@pytest.fixture
def src_with_prob(tmp_path, corpus) -> str:
    weight = corpus.column("weight").to_numpy()
    table = corpus.append_column("weight_p", pa.array(weight / weight.max()))
    return write_parquet_shards(str(tmp_path / "src_p"), table)


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_threads_1_and_4_give_identical_bytes_and_seeds_differ(tmp_path, src_with_prob, run_cli, name, to):
    command, *options = COMMANDS[name]
    rounded = ["--cast", "float64=float32"] if to == "tfrecord" else []  # weight_p and resample_rate are float64
    for dst, threads, seed in (("t1", 1, 0), ("t4", 4, 0), ("s7", 2, 7)):
        result = run_cli(command, src_with_prob, tmp_path / dst, *options, "--threads", threads, "--seed", seed,
                         "--to", to, *rounded, "-q")
        assert result.exit_code == 0, result.output
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t4"))
    assert data_bytes(str(tmp_path / "t1")) != data_bytes(str(tmp_path / "s7"))


def test_stratify_warns_when_most_data_is_discarded_and_records_stats(tmp_path, parquet_src, run_cli):
    result = run_cli("stratify", parquet_src, tmp_path / "out", "--target", "uniform")
    assert result.exit_code == 0, result.output
    warning, notes, summary = result.stderr.strip().splitlines()
    assert warning.startswith("warning: stratify discarded ") and "never appear in DST" in warning
    assert notes.startswith("stratify: ") and "per class" in notes and summary.startswith("wrote ")
    manifest = json.load(open(tmp_path / "out" / ".batchtool_manifest.json"))
    stats = manifest["stats"]
    assert manifest["command"] == "stratify" and manifest["seed"] == 0
    assert manifest["options"]["target"] == "uniform" and manifest["options"]["mode"] == "exact"
    assert sum(stats["class_counts_before"].values()) == 300 == stats["rows_in"]
    assert len(set(stats["class_counts_after"].values())) == 1
    assert stats["examples_dropped"] == 300 - manifest["output"]["rows"]
    assert stats["discarded_fraction"] > 0.5
    quiet = run_cli("stratify", parquet_src, tmp_path / "q", "--target", "uniform", "-q")
    assert quiet.stderr.strip().startswith("warning:")  # a warning is not progress: --quiet keeps it
    same_size = run_cli("stratify", parquet_src, tmp_path / "rep", "--target", "uniform", "--replacement")
    assert "a larger --size keeps more" in same_size.stderr  # class 0 (~90 %) is cut to a quarter
    kept = run_cli("stratify", parquet_src, tmp_path / "big", "--target", "uniform", "--replacement", "--size", 1200)
    assert "warning" not in kept.stderr


def test_resample_and_shuffle_manifests(tmp_path, parquet_src, corpus, run_cli):
    assert run_cli("resample", parquet_src, tmp_path / "r", "--rate", "2", "-q").exit_code == 0
    stats = json.load(open(tmp_path / "r" / ".batchtool_manifest.json"))["stats"]
    assert stats["mode"] == "rate" and stats["rate"] == {"mean": 2.0, "min": 2.0, "max": 2.0}
    assert stats["rows_out"] == read_dir(str(tmp_path / "r")).num_rows
    assert run_cli("shuffle", parquet_src, tmp_path / "s", "-q").exit_code == 0
    shuffled = read_dir(str(tmp_path / "s"))
    assert sorted(shuffled.column("key").to_pylist()) == corpus.column("key").to_pylist()
    stats = json.load(open(tmp_path / "s" / ".batchtool_manifest.json"))["stats"]
    assert stats["mode"] == "global" and stats["rows_in"] == 300 and stats["examples_dropped"] == 0


def test_stratify_balanced_batches_from_the_cli(tmp_path, parquet_src, run_cli):
    result = run_cli("stratify", parquet_src, tmp_path / "b", "--target", "0.5,0.25,0.125,0.125", "--replacement",
                     "--batch-size", "8", "--balanced-batches", "--drop-remainder", "-q")
    assert result.exit_code == 0, result.output
    assert [f.name for f in (tmp_path / "b").glob("part-*")] == ["part-00000.arrow"]  # batches: Arrow by default
    for batch in batchtool.load(str(tmp_path / "b"), shuffle=False):
        assert np.bincount(batch["label"], minlength=4).tolist() == [4, 2, 1, 1]
