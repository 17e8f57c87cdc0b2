"""What DST holds without --to: Arrow IPC when the command's (or the pipeline's last stage's) output is batches,
Parquet otherwise; --to still chooses, and the manifest and --help say which."""

from __future__ import annotations

import json

import pytest

import batchtool
from batchtool.io.manifest import MANIFEST_NAME

BATCHING = {
    "bucket": ["--boundaries", "20,40", "--batch-size", "16"],
    "segment": ["--key", "key", "--sequence", "tokens", "--num-unroll", "10", "--batch-size", "4"],
    "pack": ["--max-length", "200", "--sequence", "tokens", "--batch-size", "4", "--split-long"],
    "stratify --balanced-batches": ["--target", "uniform", "--batch-size", "8", "--balanced-batches"],
}
ROWS = {
    "stratify": ["--target", "uniform"],
    "stratify --batch-size": ["--target", "uniform", "--batch-size", "8"],
    "shuffle": [],
    "resample": ["--rate", "1"],
    "convert": [],
}


def written(dst) -> tuple[list[str], str, str]:
    """The part files of DST, and the format and codec its manifest records."""
    output = json.loads((dst / MANIFEST_NAME).read_text())["output"]
    return sorted(p.name for p in dst.iterdir() if p.name.startswith("part-")), output["format"], \
        output["compression"]


@pytest.mark.parametrize("name", list(BATCHING) + list(ROWS))
def test_batches_are_arrow_and_everything_else_parquet_without_to(tmp_path, parquet_src, run_cli, name):
    args = {**BATCHING, **ROWS}[name]
    dst = tmp_path / "out"
    result = run_cli(name.split()[0], parquet_src, dst, *args, "-q")
    assert result.exit_code == 0, result.stderr
    if name in BATCHING:
        assert written(dst) == (["part-00000.arrow"], "arrow", "none")
        assert sum(len(next(iter(b.values()))) for b in batchtool.load(str(dst))) > 0  # memory-mapped by load
    else:
        assert written(dst) == (["part-00000.parquet"], "parquet", "zstd")


@pytest.mark.parametrize("name, to, suffix, codec", [("bucket", "parquet", ".parquet", "zstd"),
                                                     ("bucket", "tfrecord", ".tfrecord", "none"),
                                                     ("shuffle", "arrow", ".arrow", "none")])
def test_to_still_chooses(tmp_path, parquet_src, run_cli, name, to, suffix, codec):
    dst = tmp_path / "out"
    assert run_cli(name, parquet_src, dst, *{**BATCHING, **ROWS}[name], "--to", to, "-q").exit_code == 0
    assert written(dst) == ([f"part-00000{suffix}"], to, codec)


def test_compression_applies_to_the_default_format(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "out"
    assert run_cli("bucket", parquet_src, dst, *BATCHING["bucket"], "--compression", "zstd", "-q").exit_code == 0
    assert written(dst) == (["part-00000.arrow"], "arrow", "zstd")
    bad = run_cli("bucket", parquet_src, tmp_path / "bad", *BATCHING["bucket"], "--compression", "snappy")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("command, default", [("bucket", "arrow"), ("segment", "arrow"), ("pack", "arrow"),
                                              ("stratify", "arrow with --balanced-batches, else parquet"),
                                              ("shuffle", "parquet"), ("resample", "parquet"), ("convert", "parquet")])
def test_help_states_the_default(run_cli, command, default):
    text = " ".join(run_cli(command, "--help").output.split())
    assert f"[default: {default}]" in text


PIPELINE = """[input]
path = "{src}"
{stages}
[output]
path = "{dst}"
{output}"""


@pytest.mark.parametrize("stages, expected", [
    ('[[stage]]\nop = "shuffle"\n[[stage]]\nop = "bucket"\nboundaries = "20,40"\nbatch-size = 16\n', "arrow"),
    ('[[stage]]\nop = "stratify"\ntarget = "uniform"\nbatch-size = 8\nbalanced-batches = true\n', "arrow"),
    ('[[stage]]\nop = "stratify"\ntarget = "uniform"\nbatch-size = 8\n', "parquet"),
    ('[[stage]]\nop = "bucket"\nboundaries = "20,40"\nbatch-size = 16\n', "parquet (given)"),
    ('[[stage]]\nop = "shuffle"\n[[stage]]\nop = "select"\ncolumns = ["key", "tokens"]\n', "parquet"),
])
def test_a_pipeline_writes_what_its_last_stage_would(tmp_path, parquet_src, run_cli, stages, expected):
    dst = tmp_path / "out"
    output = 'format = "parquet"\n' if expected.endswith("(given)") else ""
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(PIPELINE.format(src=parquet_src, stages=stages, dst=dst, output=output))
    result = run_cli("run", pipeline, "-q")
    assert result.exit_code == 0, result.stderr
    to = expected.split()[0]
    assert written(dst)[:2] == ([f"part-00000.{to}"], to)
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    assert manifest["options"]["output"]["format"] == to
