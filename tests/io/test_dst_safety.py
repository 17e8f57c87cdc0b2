"""Never write where the command reads: a DST or --tmp-dir that is, contains or lies inside an input is
refused for every command before anything is created or deleted; and DST gets the user's umask."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from conftest import SAMPLE
from dirstate import snapshot

from batchtool.core import fs
from batchtool.core.errors import DestinationError, DestinationExistsError
from batchtool.io.output import output_directory

COMMANDS = {
    "convert": (),
    "stratify": ("--target", "uniform"),
    "resample": ("--rate", "2"),
    "shuffle": (),
    "bucket": ("--boundaries", "10", "--batch-size", "4"),
    "segment": ("--key", "key", "--sequence", "tokens", "--num-unroll", "6", "--batch-size", "4"),
}
WITH_TMP_DIR = ("stratify", "shuffle", "bucket", "segment")
REFUSAL = "; batchtool never writes where it reads: choose a place outside the input\n"


@pytest.fixture
def place(tmp_path, parquet_src, monkeypatch):
    """SRC (tmp/src), a symlink to it (tmp/link), and a private system temp dir (tmp/systmp)."""
    os.symlink(parquet_src, tmp_path / "link")
    (tmp_path / "systmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    return tmp_path


# (DST, needs --overwrite, the relation named in the error): the cases and their class
DST_CASES = {
    "DST is SRC": ("src", True, "is the input {src}"),
    "DST is SRC's parent": (".", True, "is the input {parent}"),
    "DST inside SRC": ("src/out", False, "is inside the input {src}"),
    "DST inside SRC via ..": ("elsewhere/../src/out", False, "is inside the input {src}"),
    "DST is a symlink to SRC": ("link", True, "is the input {src}"),
    "DST inside a symlink to SRC": ("link/out", False, "is inside the input {src}"),
}


def expected_error(option: str, path: str, relation: str, place) -> str:
    relation = relation.format(src=place / "src", parent=place)
    return f"error: {option} {path} {relation}{REFUSAL}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", DST_CASES)
def test_dst_overlapping_src_is_refused_before_anything_is_touched(place, run_cli, command, case, monkeypatch):
    monkeypatch.chdir(place)
    dst, overwrite, relation = DST_CASES[case]
    if case == "DST is SRC's parent":
        relation = "contains the input {src}"
    before = snapshot(place)
    result = run_cli(command, place / "src", dst, *COMMANDS[command], *(["--overwrite"] if overwrite else []), "-q")
    assert result.exit_code == 2
    assert result.stderr == expected_error("DST", dst, relation, place)
    assert snapshot(place) == before  # SRC, DST's parent and the temp dir exactly as they were


@pytest.mark.parametrize("command", WITH_TMP_DIR)
@pytest.mark.parametrize("tmp_dir,relation", [("src", "is the input {src}"), ("src/tmp", "is inside the input {src}"),
                                              (".", "contains the input {src}")])
def test_tmp_dir_overlapping_src_is_refused(place, run_cli, command, tmp_dir, relation, monkeypatch):
    monkeypatch.chdir(place)
    before = snapshot(place)
    result = run_cli(command, "src", place / "out", *COMMANDS[command], "--tmp-dir", tmp_dir, "-q")
    assert result.exit_code == 2
    assert result.stderr == expected_error("--tmp-dir", tmp_dir, relation.format(src="src"), place)
    assert snapshot(place) == before


def test_the_same_commands_write_when_nothing_overlaps(place, run_cli, monkeypatch):
    """The refusals above are the check's, not some other error: beside SRC every command writes."""
    monkeypatch.chdir(place)
    for command, args in COMMANDS.items():
        extra = ("--tmp-dir", "spills") if command in WITH_TMP_DIR else ()
        result = run_cli(command, "src", f"out-{command}", *args, *extra, "-q")
        assert result.exit_code == 0, (command, result.stderr)
    assert os.listdir(place / "systmp") == [] and os.listdir(place / "spills") == []


def test_a_glob_refuses_only_what_it_could_read_back(place, run_cli, monkeypatch):
    """src/*.parquet never reads src/out/...: allowed; src/**/*.parquet would: refused; and a DST
    containing the matched files is refused either way."""
    monkeypatch.chdir(place)
    assert run_cli("convert", "src/*.parquet", "src/out", "-q").exit_code == 0
    shutil.rmtree(place / "src" / "out")
    before = snapshot(place)
    deep = run_cli("convert", "src/**/*.parquet", "src/out", "-q")
    assert deep.exit_code == 2 and deep.stderr == expected_error("DST", "src/out", "is inside the input src", place)
    over = run_cli("convert", "src/*.parquet", "src", "--overwrite", "-q")
    assert over.exit_code == 2
    assert over.stderr == expected_error("DST", "src", "contains the input src/part-00000.parquet", place)
    assert snapshot(place) == before


def write_pipeline(path, src: str, dst: str, extra: str = "") -> str:
    path.write_text(f'{extra}\n[input]\npath = "{src}"\n\n[[stage]]\nop = "shuffle"\n\n[[stage]]\nop = "bucket"\n'
                    f'boundaries = [10]\nbatch-size = 4\n\n[output]\npath = "{dst}"\noverwrite = true\n')
    return str(path)


@pytest.mark.parametrize("dst,extra,label,relation", [
    ("src", "", "[output] path", "is the input {src}"),
    (".", "", "[output] path", "contains the input {src}"),
    ("src/out", "", "[output] path", "is inside the input {src}"),
    ("link", "", "[output] path", "is the input {src}"),
    ("out", 'tmp-dir = "src/spills"', "tmp-dir", "is inside the input {src}"),
])
def test_run_refuses_an_output_or_tmp_dir_overlapping_its_input(place, run_cli, dst, extra, label, relation):
    pipeline = write_pipeline(place / "p.toml", "src", dst, extra)
    before = snapshot(place)
    result = run_cli("run", pipeline, "-q")
    target = os.path.join(place, dst if label == "[output] path" else "src/spills")
    assert result.exit_code == 2
    assert result.stderr == expected_error(f"{pipeline}: {label}", target, relation, place)
    assert snapshot(place) == before


def test_sample_pipeline_overwrite_is_safe(tmp_path, run_cli):
    """sample_data/pipeline.toml keeps `overwrite = true`: it replaces its own output, and an edited copy
    whose output is its input is refused instead of replacing it."""
    shutil.copytree(os.path.join(SAMPLE, "parquet"), tmp_path / "parquet")
    text = open(os.path.join(SAMPLE, "pipeline.toml")).read()
    assert 'overwrite = true' in text
    (tmp_path / "pipeline.toml").write_text(text)
    for _ in range(2):
        assert run_cli("run", tmp_path / "pipeline.toml", "-q").exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["out", "parquet", "pipeline.toml"]
    (tmp_path / "pipeline.toml").write_text(text.replace('path = "out"', 'path = "parquet"'))
    before = snapshot(tmp_path)
    result = run_cli("run", tmp_path / "pipeline.toml", "-q")
    assert result.exit_code == 2 and "is the input" in result.stderr
    assert snapshot(tmp_path) == before


def test_output_directory_itself_refuses_an_overlap(tmp_path):
    """The output directory's own check, for any writer that did not open its input through job.open_source."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.parquet").write_bytes(b"data")
    before = snapshot(tmp_path)
    for dst in (src, src / "out", tmp_path):
        with pytest.raises(DestinationError, match="never writes where it reads"):
            with output_directory(str(dst), overwrite=True, reads=[str(src / "a.parquet"), str(src)]):
                raise AssertionError("the block must not run")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("a,b,relation", [
    ("s3://bucket/data", "s3://bucket/data", "is"),
    ("s3://bucket/data/", "s3://bucket/./data", "is"),
    ("s3://bucket/data/out", "s3://bucket/data", "is inside"),
    ("s3://bucket/x/../data/out", "s3://bucket/data", "is inside"),
    ("s3://bucket", "s3://bucket/data/part-0.parquet", "contains"),
    ("s3://bucket/dat", "s3://bucket/data", None),
    ("s3://other/data", "s3://bucket/data", None),
    ("gs://bucket/data", "s3://bucket/data", None),
    ("s3://bucket/data", "/bucket/data", None),
])
def test_object_store_paths_compare_by_scheme_bucket_and_prefix(a, b, relation):
    found = fs.overlap(a, [b])
    assert (found[1] if found else None) == relation


def test_file_uris_are_local_paths(tmp_path):
    (tmp_path / "src").mkdir()
    assert fs.overlap(f"file://{tmp_path}/src/out", [str(tmp_path / "src")]) == (str(tmp_path / "src"), "is inside")


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_dst_gets_the_permissions_the_umask_gives(tmp_path, parquet_src, run_cli, umask):
    old = os.umask(umask)
    try:
        assert run_cli("convert", parquet_src, tmp_path / "new" / "dst", "-q").exit_code == 0
        assert run_cli("convert", parquet_src, tmp_path / "new" / "dst", "--overwrite", "-q").exit_code == 0
    finally:
        os.umask(old)
    dst = tmp_path / "new" / "dst"
    for directory in (tmp_path / "new", dst):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o777 & ~umask
    for name in os.listdir(dst):
        assert stat.S_IMODE(os.stat(dst / name).st_mode) == 0o666 & ~umask


# -- an existing empty DST ----------------------------------------------------------------------------------------


def data_files(dst) -> dict[str, bytes]:
    """DST's files but its manifest (whose `run` section differs between runs), by name."""
    return {name: (dst / name).read_bytes() for name in sorted(os.listdir(dst)) if not name.startswith(".")}


def without_overwrite(path, dst: str) -> str:
    """write_pipeline's file from src to `dst`, with overwrite = false."""
    path.write_text(open(write_pipeline(path, "src", dst)).read().replace("overwrite = true", "overwrite = false"))
    return str(path)


def test_an_existing_empty_dst_is_filled_without_overwrite(place, run_cli, monkeypatch):
    """An empty directory holds nothing to lose: every command and `run` write into it as if it did not exist (the
    bytes of a run into a new DST), and leave nothing beside it."""
    monkeypatch.chdir(place)
    assert run_cli("convert", "src", "new", "-q").exit_code == 0
    (place / "empty").mkdir()
    result = run_cli("convert", "src", "empty", "-q")
    assert result.exit_code == 0, result.stderr
    assert data_files(place / "empty") == data_files(place / "new")
    (place / "empty-run").mkdir()
    result = run_cli("run", without_overwrite(place / "p.toml", "empty-run"), "-q")
    assert result.exit_code == 0, result.stderr
    assert "part-00000.arrow" in os.listdir(place / "empty-run")
    assert sorted(os.listdir(place)) == ["empty", "empty-run", "link", "new", "p.toml", "src", "systmp"]


@pytest.mark.parametrize("content", ["file", ".hidden", "subdir/"])
def test_a_dst_holding_anything_is_still_refused_without_overwrite(place, run_cli, content, monkeypatch):
    """Even a hidden file or an empty subdirectory is something DST holds: refused, for commands and `run`."""
    monkeypatch.chdir(place)
    (place / "dst").mkdir()
    if content.endswith("/"):
        (place / "dst" / content).mkdir()
    else:
        (place / "dst" / content).write_text("kept")
    without_overwrite(place / "p.toml", "dst")
    before = snapshot(place)
    result = run_cli("convert", "src", "dst", "-q")
    assert (result.exit_code, result.stderr) == (2, "error: dst: destination exists (pass --overwrite to replace it)\n")
    result = run_cli("run", "p.toml", "-q")
    assert result.exit_code == 2 and f"[output] path {place / 'dst'} exists" in result.stderr
    assert snapshot(place) == before


def test_an_empty_dst_inside_the_input_is_still_refused(place, run_cli, monkeypatch):
    monkeypatch.chdir(place)
    (place / "src" / "out").mkdir()
    before = snapshot(place)
    result = run_cli("convert", "src/**/*.parquet", "src/out", "-q")
    assert result.exit_code == 2
    assert result.stderr == expected_error("DST", "src/out", "is inside the input src", place)
    assert snapshot(place) == before


def test_an_empty_dst_filled_meanwhile_is_not_replaced(tmp_path):
    """The empty directory is replaced by one rename, which the OS refuses once anything is in it: a file put in DST
    while the output was being written survives, the output's temporary directory does not."""
    dst = tmp_path / "dst"
    dst.mkdir()
    with pytest.raises(DestinationExistsError, match="destination exists"):
        with output_directory(str(dst), overwrite=False) as tmp:
            (Path(tmp) / "part-00000.parquet").write_text("output")
            (dst / "theirs").write_text("written meanwhile")
    assert sorted(os.listdir(tmp_path)) == ["dst"] and os.listdir(dst) == ["theirs"]
