"""Every writing command ends with the same summary as `run`, and `run` warns when stratify discards most data."""

from __future__ import annotations

import re

import pytest
from conftest import SAMPLE

FINAL = re.compile(r"wrote [\d,]+ rows in [\d,]+ (batch(?:es)?|row groups?) to \d+ shard\(s\) in .+; \d+\.\d s, "
                   r"peak memory [\d,]+ MiB")
BATCHES = {"bucket", "segment"}
"""The commands of COMMANDS whose output is batches: the others' summaries count the row groups they wrote."""

COMMANDS = {
    "convert": [],
    "shuffle": [],
    "resample": ["--rate", "2", "--seed", "1"],
    "stratify": ["--target", "uniform"],
    "bucket": ["--length", "tokens", "--boundaries", "10,20", "--batch-size", "8"],
    "segment": ["--key", "key", "--sequence", "tokens", "--num-unroll", "6", "--batch-size", "4"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_writing_command_ends_with_the_shared_summary(tmp_path, parquet_src, run_cli, command):
    result = run_cli(command, parquet_src, tmp_path / "dst", *COMMANDS[command])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("warning: ", "auto-buckets: "))]
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"{command}: 300 rows in, ") and FINAL.fullmatch(lines[1]), lines
    assert FINAL.fullmatch(lines[1]).group(1).startswith("batch" if command in BATCHES else "row group"), lines
    assert str(tmp_path / "dst") in lines[1]


def test_summary_lines_say_what_was_dropped_and_duplicated(tmp_path, parquet_src, run_cli):
    result = run_cli("resample", parquet_src, tmp_path / "dst", "--rate", "1", "--seed", "3")
    notes = result.stderr.splitlines()[0]
    assert re.fullmatch(r"resample: 300 rows in, [\d,]+ out; [\d,]+ dropped, [\d,]+ duplicated", notes), notes


def test_run_warns_like_stratify_and_ends_the_same_way(tmp_path, run_cli):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[input]\npath = "{SAMPLE}/parquet"\n[[stage]]\nop = "stratify"\ntarget = "uniform"\n'
                        f'[output]\npath = "{tmp_path}/out"\n')
    result = run_cli("run", pipeline)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == ("warning: stage 1 (stratify) discarded 95.9% of the examples (3,836 of 4,000 never appear "
                        "in DST); --replacement upsamples instead")
    assert lines[2].split() == ["1", "stratify", "4,000", "164", "per", "class", "41/41/41/41,", "3,836", "dropped"]
    assert FINAL.fullmatch(lines[-1]), lines
    quiet = run_cli("run", pipeline, "-q", "--overwrite")
    assert quiet.exit_code == 0 and quiet.stderr.splitlines() == lines[:1]  # the warning is never hidden


@pytest.fixture
def bars(monkeypatch):
    """Every progress bar opened: (label, total)."""
    from batchtool.core import progress
    opened: list[tuple[str, int | None]] = []
    real = progress.bar

    def record(desc, total, *args, **kwargs):
        opened.append((desc, total))
        return real(desc, total, *args, **kwargs)

    monkeypatch.setattr(progress, "bar", record)
    return opened


LABEL = re.compile(r"(bucket|check|convert|resample|segment|shuffle|stratify|stage \d+ \([a-z]+\)): [a-z -]+")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_progress_labels_follow_one_pattern(tmp_path, parquet_src, run_cli, bars, command):
    assert run_cli(command, parquet_src, tmp_path / "dst", *COMMANDS[command], "-q").exit_code == 0
    assert bars and all(LABEL.fullmatch(desc) and desc.startswith(command) for desc, _ in bars), bars


def test_run_progress_labels_follow_the_same_pattern(tmp_path, run_cli, bars):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[input]\npath = "{SAMPLE}/parquet"\n[[stage]]\nop = "stratify"\ntarget = "uniform"\n'
                        f'batch-size = 8\nbalanced-batches = true\n[output]\npath = "{tmp_path}/out"\n')
    assert run_cli("run", pipeline, "-q").exit_code == 0
    pipeline.write_text(pipeline.read_text().replace("batch-size = 8\nbalanced-batches = true\n",
                                                     '[[stage]]\nop = "shuffle"\n') + "overwrite = true\n")
    assert run_cli("run", pipeline, "-q").exit_code == 0
    assert run_cli("run", pipeline, "-q", "--dry-run").exit_code == 0
    assert bars and all(LABEL.fullmatch(desc) and desc.startswith("stage ") for desc, _ in bars), [
        desc for desc, _ in bars if not (LABEL.fullmatch(desc) and desc.startswith("stage "))]


def test_a_tfrecord_output_gives_its_bars_a_total_from_the_manifest(tmp_path, parquet_src, run_cli, bars):
    assert run_cli("convert", parquet_src, tmp_path / "tfr", "--to", "tfrecord", "-q").exit_code == 0
    bars.clear()
    assert run_cli("convert", tmp_path / "tfr", tmp_path / "back", "-q").exit_code == 0
    assert run_cli("check", tmp_path / "tfr", "--no-nulls", "key", "-q").exit_code == 0
    assert bars == [("convert: write", 300), ("check: scan", 300)]


RUN_SECTION = {"wall_seconds": 1.0, "peak_rss_bytes": 3 << 20}
DISCARDING = {"rows_in": 4000, "rows_out": 164, "examples_dropped": 3836, "discarded_fraction": 0.959,
              "replacement": False}
AUTO = {"rows_in": 164, "rows_out": 160, "boundaries": [10, 20], "batches": 20,
        "auto_buckets": {"k": 3, "expected_padding_efficiency": 0.9, "quantile_expected_padding_efficiency": 0.8}}


def test_each_op_says_its_own_lines_and_run_only_their_warnings(capsys):
    """report() asks each step's op what to say (Operation.said: its lines and its note): a command prints all of it,
    `run` only the warnings, naming the stage, and its table ends each stage's line with the op's own words."""
    from batchtool.cli.common import report
    output = {"format": "parquet", "rows": 164, "batches": 1, "files": ["part-00000.parquet"]}
    report({"command": "stratify", "stats": DISCARDING, "output": output, "run": RUN_SECTION}, "dst", quiet=True,
           batches=False)
    assert capsys.readouterr().err == ("warning: stratify discarded 95.9% of the examples (3,836 of 4,000 never "
                                       "appear in DST); --replacement upsamples instead\n")
    report({"command": "bucket", "stats": AUTO, "output": output, "run": RUN_SECTION}, "dst", quiet=False,
           batches=True)
    assert capsys.readouterr().err.splitlines()[:2] == [
        "auto-buckets: boundaries 10,20; expected padding efficiency 90.0% (3 quantile buckets: 80.0%)",
        "bucket: 164 rows in, 164 out; 20 batches, boundaries 10,20"]
    stages = [{"stage": 1, "op": "shuffle", "mode": "global", "rows_in": 4000, "rows_out": 4000},
              {"stage": 2, "op": "stratify", **DISCARDING}, {"stage": 3, "op": "bucket", **AUTO}]
    manifest = {"command": "run", "stats": {"rows_in": 4000, "stages": stages}, "output": output, "run": RUN_SECTION}
    report(manifest, "dst", quiet=False, batches=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("warning: stage 2 (stratify) discarded 95.9% of the examples")
    assert lines[2].split() == ["1", "shuffle", "4,000", "4,000", "global", "shuffle"]
    assert not any(line.startswith("auto-buckets") for line in lines) and len(lines) == 6


def test_the_shared_summary_names_no_operation():
    """What an op says is its own (ops/*.py): the CLI's shared report branches on no op's name."""
    from batchtool.cli import common
    from batchtool.ops import OPERATIONS
    source = open(common.__file__).read()
    assert [name for name in OPERATIONS if f'"{name}"' in source] == []
