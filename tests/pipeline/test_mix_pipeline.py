"""Pipelines that start from a mix ([input] path = [SRC, SRC, ...], first stage op = "mix"): the bytes of the CLI
chain, exact per-batch shares after bucket --balance source, pack of the mixture, dry-run counts, file errors; and
the mix on the pickling stand-in for Ray."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from conftest import SAMPLE, data_bytes, read_dir
from test_mix import SIZES, check_rows, per_source, sources, write_sources  # noqa: F401  (the fixture)
from test_pickling_engine import fails_alike, run_both
from test_pickling_engine import pipeline as pickled_pipeline

WEIGHTS = "0.5,0.3,0.2"


def pipeline(tmp_path, srcs: list[str], *stages: str, name: str = "pipeline.toml") -> str:
    paths = ", ".join(f'"{s}"' for s in srcs)
    body = "\n".join(f"[[stage]]\n{s.strip()}\n" for s in stages)
    path = tmp_path / name
    path.write_text(f'[input]\npath = [{paths}]\n\n{body}\n[output]\npath = "{tmp_path / "out"}"\n')
    return str(path)


MIX = f'op = "mix"\nweights = [{WEIGHTS}]\nreplacement = true\nsize = 400'
BUCKET = 'op = "bucket"\nbalance = "source"\ntarget = [0.5, 0.3, 0.2]\nboundaries = [3]\nbatch-size = 10'


def test_mix_then_bucket_balance_source_is_the_cli_chain_with_exact_shares_per_batch(tmp_path, sources, run_cli):
    result = run_cli("run", pipeline(tmp_path, sources, MIX, BUCKET), "-q")
    assert result.exit_code == 0, result.stderr
    assert run_cli("mix", *sources, tmp_path / "m", "-q", "--weights", WEIGHTS, "--replacement", "--size",
                   "400").exit_code == 0
    assert run_cli("bucket", tmp_path / "m", tmp_path / "b", "-q", "--balance", "source", "--target", WEIGHTS,
                   "--boundaries", "3", "--batch-size", "10").exit_code == 0
    assert data_bytes(str(tmp_path / "out")) == data_bytes(str(tmp_path / "b"))
    out = read_dir(str(tmp_path / "out"))
    batches = 0
    for b in np.unique(out.column("batch").to_numpy()):
        rows = out.filter(pa.compute.equal(out.column("batch"), b))
        if rows.num_rows == 10:
            assert per_source(rows) == [5, 3, 2]
            batches += 1
    assert batches >= 35


def test_a_padded_mix_stage_writes_the_command_s_bytes(tmp_path, sources, run_cli):
    stage = MIX + '\nbatch-size = 10\npad = true\nmask = true\npad-value = ["tokens=-1"]'
    result = run_cli("run", pipeline(tmp_path, sources, stage), "-q")
    assert result.exit_code == 0, result.stderr
    assert run_cli("mix", *sources, tmp_path / "m", "-q", "--weights", WEIGHTS, "--replacement", "--size", "400",
                   "--batch-size", "10", "--pad", "--mask", "--pad-value", "tokens=-1").exit_code == 0
    assert data_bytes(str(tmp_path / "out")) == data_bytes(str(tmp_path / "m"))
    assert read_dir(str(tmp_path / "out")).column_names == ["key", "label", "tokens", "source", "length", "mask"]


def test_mix_then_pack_packs_the_mixture(tmp_path, sources, run_cli):
    mix = f'op = "mix"\nnames = ["a", "b", "c"]\nweights = {{ a = 2, c = 1 }}'
    result = run_cli("run", pipeline(tmp_path, sources, mix, 'op = "pack"\nmax-length = 12\nbatch-size = 4'), "-q")
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "out"))
    keys = [k for row in out.column("key").to_pylist() for k in row]
    assert sorted(keys) == sorted(k for k in keys)  # each packed example once
    taken = np.bincount([int(k[1]) for k in keys], minlength=3).tolist()
    assert taken == [90, 0, 45]


def test_dry_run_reports_each_source_s_rows_and_writes_nothing(tmp_path, sources, run_cli):
    result = run_cli("run", pipeline(tmp_path, sources, f'op = "mix"\nweights = [{WEIGHTS}]', BUCKET), "--dry-run")
    assert result.exit_code == 0, result.stderr
    mix_line = next(line for line in result.stdout.splitlines() if line.startswith("1 mix"))
    assert mix_line.split()[2:4] == ["235", "224"] and "per source 112/67/45" in mix_line
    assert next(line for line in result.stdout.splitlines() if line.startswith("2 bucket")).split()[2] == "224"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stage", [
    'schedule = "{schedule}"', 'schedule = "{schedule}"\nsize = 150', 'weights = [1, 1, 1]\nby = "rows"'])
def test_a_scheduled_mix_s_dry_run_plans_the_rows_and_batches_the_run_writes(tmp_path, sources, run_cli, stage):
    schedule = write_schedule(tmp_path, 200)
    path = pipeline(tmp_path, sources, f'op = "mix"\nnames = ["a", "b", "c"]\n{stage.format(schedule=schedule)}\n'
                                       'batch-size = 16')
    dry = run_cli("run", path, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    planned = next(line for line in dry.stdout.splitlines() if line.startswith("1 mix")).split(None, 4)
    result = run_cli("run", path)
    assert result.exit_code == 0, result.stderr
    done = next(line for line in result.stderr.splitlines() if line.startswith("1 mix")).split(None, 4)
    assert planned[2:4] == done[2:4] == [f"{sum(SIZES):,}", done[3]] and done[3] != "?"
    written = re.search(r"in ([\d,]+) batches", result.stderr).group(1)
    assert planned[4].startswith(f"{written} batches, per source ") and planned[4].split()[-1] in done[4]


def write_schedule(tmp_path, total: int):
    schedule = tmp_path / "schedule.toml"
    schedule.write_text(f"total = {total}\n[[point]]\nat = 0\nweights = {{ a = 0.6, b = 0.3, c = 0.1 }}\n"
                        "[[point]]\nat = 100\nweights = { a = 0.5, b = 0.3, c = 0.2 }\n")
    return schedule


def test_a_scheduled_mix_s_dry_run_fails_as_its_run_when_a_source_runs_out(tmp_path, sources, run_cli):
    path = pipeline(tmp_path, sources, f'op = "mix"\nnames = ["a", "b", "c"]\n'
                                       f'schedule = "{write_schedule(tmp_path, 400)}"\nbatch-size = 16')
    dry, run = run_cli("run", path, "--dry-run"), run_cli("run", path)
    assert dry.exit_code == run.exit_code == 2 and dry.stderr == run.stderr and dry.stderr.count("\n") == 1
    assert "stage 1 (mix): source 'a' runs out after" in dry.stderr


def test_a_mix_by_tokens_dry_run_says_what_it_knows(tmp_path, sources, run_cli):
    path = pipeline(tmp_path, sources, f'op = "mix"\nweights = [{WEIGHTS}]\nby = "tokens"\nsize = 900\n'
                                       'batch-size = 64')
    result = run_cli("run", path, "--dry-run")
    assert result.exit_code == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("1 mix"))
    assert line.split()[2:4] == [f"{sum(SIZES):,}", "?"]
    assert line.endswith("rows out follow the documents' lengths (counted as the mixture is written); 900 tokens "
                         "planned")


@pytest.mark.parametrize("stages, path, expected", [
    (['op = "shuffle"'], "several", "key 'path': 3 sources are mixed by a first stage op = \"mix\""),
    (['op = "shuffle"', MIX], "several", "stage 2 (mix): key 'op': mix mixes the sources [input] path lists"),
    ([MIX], "one", "stage 1 (mix): key 'op': mix mixes the sources [input] path lists"),
    (['op = "mix"\nnames = ["a", "b"]\nweights = { a = 1 }'], "several", "stage 1 (mix): key 'names': 2 names for the 3 sources"),
    ([MIX.replace("weights", "wieghts")], "several", "unknown key 'wieghts' (did you mean 'weights'?)"),
])
def test_pipeline_file_errors_name_the_key(tmp_path, sources, run_cli, stages, path, expected):
    text = pipeline(tmp_path, sources, *stages)
    if path == "one":
        with open(text) as f:
            body = f.read().replace(f'path = [{", ".join(chr(34) + s + chr(34) for s in sources)}]',
                                    f'path = "{sources[0]}"')
        with open(text, "w") as f:
            f.write(body)
    result = run_cli("run", text)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr


def test_mix_runs_alike_on_the_pickling_engine(tmp_path, run_cli, monkeypatch):
    srcs = write_sources(tmp_path / "in")
    for extra, patch in ((["--batch-size", "8"], None), ([], monkeypatch)):  # then no work on local threads
        engine = run_both(run_cli, tmp_path / f"run{len(extra)}",
                          lambda dst: ["mix", *srcs, dst, "--weights", WEIGHTS, "--replacement", "--size", "300",
                                       "--memory", "30KB", *extra], patch)
        assert engine.items
    out = read_dir(str(tmp_path / "run0" / "pickled"))
    assert per_source(out) == [150, 90, 60]
    check_rows(out)


def test_mix_errors_alike_on_the_pickling_engine(tmp_path, run_cli):
    srcs = write_sources(tmp_path / "in", (10, 0, 5))
    _, line = fails_alike(run_cli, tmp_path, ["mix", *srcs, "--weights", WEIGHTS])
    assert f"source 'de' ({srcs[1]}) is empty" in line
    assert os.path.isdir(srcs[1])


def test_the_sample_mix_pipeline_runs_as_written(tmp_path, run_cli):
    shutil.copytree(SAMPLE, tmp_path / "sample_data", ignore=shutil.ignore_patterns("out"))
    result = run_cli("run", tmp_path / "sample_data" / "mix.toml", "-q")
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "sample_data" / "out" / "mix"))
    assert out.num_rows == 5327
    sizes = Counter(out.column("batch").to_pylist())
    for b, n in sizes.items():
        if n == 16:
            rows = out.filter(pa.compute.equal(out.column("batch"), b))
            assert per_source(rows, 2) == [12, 4]


@pytest.mark.parametrize("stages", [[MIX, BUCKET], [MIX + "\nbatch-size = 8"], [MIX + "\nbatch-size = 8\npad = true"]],
                         ids=["mix-bucket", "mix-batches", "mix-padded-batches"])
def test_a_pipeline_from_a_mix_runs_alike_on_the_pickling_engine(tmp_path, run_cli, monkeypatch, stages):
    srcs = write_sources(tmp_path / "in")
    paths = ", ".join(f'"{s}"' for s in srcs)
    body = "\n".join(f"[[stage]]\n{s}\n" for s in stages)
    text = f'memory = "30KB"\n[input]\npath = [{paths}]\ncolumns = ["key", "tokens"]\n\n{body}\n' \
           '[output]\npath = "{dst}"\n'
    engine = run_both(run_cli, tmp_path, pickled_pipeline(tmp_path, text), monkeypatch)
    assert engine.items
