"""A manifest is input like any other: malformed or hostile ones are one error line, and its paths never leave DST."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import write_parquet_shards

import batchtool
from batchtool.core.errors import InputError
from batchtool.io.manifest import LEGACY_MANIFEST_NAME, MANIFEST_NAME
from batchtool.core.synthetic import make_table


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """A Parquet and a TFRecord batch-shard output (two shards each), made once and copied per test."""
    from batchtool.cli import cli
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("outputs")
    src = write_parquet_shards(str(root / "src"), make_table(40, seed=5))
    made = {}
    for to in ("parquet", "tfrecord"):
        dst = str(root / to)
        result = CliRunner().invoke(cli, ["bucket", src, dst, "--boundaries", "30", "--batch-size", "8",
                                          "--shard-rows", "24", "--to", to, "-q"], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        made[to] = dst
    return made


@pytest.fixture
def dst(tmp_path, outputs) -> Path:
    return Path(shutil.copytree(outputs["parquet"], tmp_path / "dst"))


def edit(dst: Path, change, name: str = MANIFEST_NAME) -> Path:
    """Rewrite DST's manifest through `change(manifest) -> new manifest`."""
    path = dst / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return path


def set_in(keys: tuple, value):
    """A change that sets manifest[keys[0]][keys[1]]... to value."""
    def change(manifest):
        node = manifest
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        return manifest
    return change


def drop(key: str):
    def change(manifest):
        del manifest[key]
        return manifest
    return change


MALFORMED = {
    "not JSON": (None, "unreadable manifest"),
    "a list": (lambda m: [1, 2], r"the manifest is \[1, 2\], expected a JSON object"),
    "a string": (lambda m: "manifest", "expected a JSON object"),
    "no output": (drop("output"), "no 'output' section"),
    "no schema": (drop("schema"), "no 'schema' section"),
    "output a list": (set_in(("output",), []), r"output is \[\], expected an object"),
    "files not a list": (set_in(("output", "files"), {"path": "x"}), "output.files is .*, expected a list"),
    "file not an object": (set_in(("output", "files", 0), "part-00000.parquet"),
                           r"output.files\[0\] is 'part-00000.parquet', expected an object"),
    "path not a string": (set_in(("output", "files", 1, "path"), 7), r"output.files\[1\].path is 7"),
    "rows a string": (set_in(("output", "files", 0, "rows"), "ten"),
                      r"output.files\[0\].rows is 'ten', expected a non-negative integer"),
    "batches negative": (set_in(("output", "files", 1, "batches"), -1), r"output.files\[1\].batches is -1"),
    "bytes a float": (set_in(("output", "files", 0, "bytes"), 1.5), r"output.files\[0\].bytes is 1.5"),
    "bytes a bool": (set_in(("output", "files", 0, "bytes"), True), r"output.files\[0\].bytes is True"),
    "total rows null": (set_in(("output", "rows"), None), "output.rows is None"),
    "no sha256": (set_in(("output", "files", 0, "sha256"), None), r"output.files\[0\].sha256 is None"),
    "format unknown": (set_in(("output", "format"), "csv"), "output.format is 'csv'"),
    "schema not base64": (set_in(("schema",), "@@not base64@@"), "schema does not decode"),
    "schema not Arrow": (set_in(("schema",), base64.b64encode(b"hello world").decode()), "schema does not decode"),
    "schema a number": (set_in(("schema",), 12), "schema is 12"),
    "stats a list": (set_in(("stats",), [1]), r"stats is \[1\], expected an object"),
    "options a string": (set_in(("options",), "x"), "options is 'x', expected an object"),
    "a newer version": (set_in(("manifest_version",), 99), "written by a newer batchtool"),
    "same file twice": (lambda m: set_in(("output", "files", 1, "path"), m["output"]["files"][0]["path"])(m),
                        "is listed twice"),
}


def malform(dst: Path, case: str) -> str:
    change, _ = MALFORMED[case]
    if change is None:
        (dst / MANIFEST_NAME).write_text('{"output": {"files": [')
    else:
        edit(dst, change)
    return MALFORMED[case][1]


CONSUMERS = {
    "inspect": lambda dst, out: ("inspect", dst),
    "check": lambda dst, out: ("check", dst, "--min-rows", "1"),
    "check --checksums": lambda dst, out: ("check", dst, "--checksums"),
    "convert (DST as input)": lambda dst, out: ("convert", dst, out),
    "bucket (DST as input)": lambda dst, out: ("bucket", dst, out, "--boundaries", "10", "--batch-size", "4"),
}


def assert_one_error_line(result, *patterns: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for pattern in patterns:
        assert re.search(pattern, lines[0]), (pattern, lines[0])
    return lines[0]


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_manifest_is_one_error_line(dst, tmp_path, run_cli, case, consumer):
    pattern = malform(dst, case)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    result = run_cli(*CONSUMERS[consumer](dst, tmp_path / "out"))
    line = assert_one_error_line(result, pattern)
    assert f"{dst / MANIFEST_NAME}: " in line
    assert not (tmp_path / "out").exists()
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_a_manifest_too_large_is_refused_before_it_is_read(dst, tmp_path, run_cli, consumer):
    """A sparse 256 MB + 1 manifest: refused by its size, never read (load too)."""
    with open(dst / MANIFEST_NAME, "wb") as f:
        f.truncate((256 << 20) + 1)
    pattern = re.escape("268,435,457 bytes, too large for a batchtool manifest (at most 268,435,456)")
    assert f"{dst / MANIFEST_NAME}: " in assert_one_error_line(run_cli(*CONSUMERS[consumer](dst, tmp_path / "out")),
                                                               pattern)
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match=pattern):
        batchtool.load(str(dst))


@pytest.mark.parametrize("case", MALFORMED)
def test_load_refuses_a_malformed_manifest_with_an_input_error(dst, case):
    pattern = malform(dst, case)
    with pytest.raises(InputError, match=pattern) as err:
        batchtool.load(str(dst))
    assert str(err.value).startswith(f"{dst / MANIFEST_NAME}: ")


# ---- paths that leave the dataset directory


@pytest.fixture
def outside(tmp_path, dst) -> Path:
    """A valid shard outside DST (a copy of part-00000): following a path to it would read real rows."""
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.copy(dst / "part-00000.parquet", secret / "part-00000.parquet")
    return secret / "part-00000.parquet"


def escape_by_dotdot(dst: Path, outside: Path) -> str:
    rel = os.path.relpath(outside, dst)
    assert rel.startswith("..")
    edit(dst, set_in(("output", "files", 0, "path"), rel))
    return rf"output.files\[0\].path '{rel}' leaves the dataset directory"


def escape_by_absolute_path(dst: Path, outside: Path) -> str:
    edit(dst, set_in(("output", "files", 0, "path"), str(outside)))
    return rf"output.files\[0\].path '{outside}' is absolute"


def escape_by_symlink(dst: Path, outside: Path) -> str:
    (dst / "part-00000.parquet").unlink()
    (dst / "part-00000.parquet").symlink_to(outside)
    return rf"output.files\[0\].path 'part-00000.parquet' leaves the dataset directory \(through a symlink to {outside}\)"


def escape_by_etc_passwd(dst: Path, outside: Path) -> str:
    edit(dst, set_in(("output", "files", 1, "path"), "../../../../../../../../etc/passwd"))
    return r"output.files\[1\].path '../../../../../../../../etc/passwd' leaves the dataset directory"


ESCAPES = [escape_by_dotdot, escape_by_absolute_path, escape_by_symlink, escape_by_etc_passwd]


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda f: f.__name__)
def test_check_checksums_refuses_a_path_out_of_dst(dst, outside, run_cli, escape):
    pattern = escape(dst, outside)
    line = assert_one_error_line(run_cli("check", dst, "--checksums"), pattern)
    assert line.startswith(f"error: {dst / MANIFEST_NAME}: ")


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda f: f.__name__)
def test_load_refuses_a_path_out_of_dst(dst, outside, escape):
    pattern = escape(dst, outside)
    with pytest.raises(InputError, match=pattern):
        batchtool.load(str(dst))


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda f: f.__name__)
def test_inspect_and_commands_refuse_a_path_out_of_dst(dst, outside, run_cli, tmp_path, escape):
    pattern = escape(dst, outside)
    assert_one_error_line(run_cli("inspect", dst), pattern)
    assert_one_error_line(run_cli("convert", dst, tmp_path / "out"), pattern)
    assert not (tmp_path / "out").exists()


def test_a_manifest_symlinked_from_outside_is_refused(dst, tmp_path, run_cli):
    real = tmp_path / "elsewhere.json"
    (dst / MANIFEST_NAME).rename(real)
    (dst / MANIFEST_NAME).symlink_to(real)
    assert_one_error_line(run_cli("check", dst, "--checksums"),
                          rf"the manifest '{MANIFEST_NAME}' leaves the dataset directory \(through a symlink")
    with pytest.raises(InputError, match="leaves the dataset directory"):
        batchtool.load(str(dst))


def test_a_path_into_a_subdirectory_of_dst_is_fine(dst, run_cli):
    (dst / "sub").mkdir()
    (dst / "part-00001.parquet").rename(dst / "sub" / "part-00001.parquet")
    edit(dst, set_in(("output", "files", 1, "path"), "sub/../sub/part-00001.parquet"))
    result = run_cli("check", dst, "--checksums")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    assert len(list(batchtool.load(str(dst)))) == manifest["output"]["batches"]


# ---- batchtool 0.1's manifest.json


def legacy_copy(outputs: dict[str, str], to: str, tmp_path: Path) -> Path:
    dst = Path(shutil.copytree(outputs[to], tmp_path / f"legacy-{to}"))
    (dst / MANIFEST_NAME).rename(dst / LEGACY_MANIFEST_NAME)
    return dst


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_outputs_with_the_legacy_manifest_name_are_still_read(outputs, tmp_path, run_cli, to):
    dst = legacy_copy(outputs, to, tmp_path)
    new = Path(outputs[to])
    assert [b["key"].tolist() for b in batchtool.load(str(dst))] == [b["key"].tolist()
                                                                     for b in batchtool.load(str(new))]
    result = run_cli("inspect", dst, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["manifest"]["command"] == "bucket"
    result = run_cli("check", dst, "--checksums")
    assert result.exit_code == 0 and "PASS" in result.stdout, result.stderr
    result = run_cli("convert", dst, tmp_path / "out", "-q")  # TFRecord: the manifest's exact schema
    assert result.exit_code == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "out"))[0] == MANIFEST_NAME
    assert LEGACY_MANIFEST_NAME not in os.listdir(tmp_path / "out")


def test_a_malformed_legacy_manifest_is_refused_too(outputs, tmp_path, run_cli):
    dst = legacy_copy(outputs, "parquet", tmp_path)
    edit(dst, set_in(("output", "files", 0, "path"), "/etc/passwd"), name=LEGACY_MANIFEST_NAME)
    assert_one_error_line(run_cli("check", dst, "--checksums"), f"{LEGACY_MANIFEST_NAME}: output.files")


def test_the_new_name_wins_over_the_legacy_one(dst, run_cli):
    (dst / LEGACY_MANIFEST_NAME).write_text(json.dumps({"batchtool_version": "0.1.0"}))
    assert run_cli("check", dst, "--checksums").exit_code == 0


@pytest.mark.parametrize("content", ['{"name": "my corpus", "files": 3}', "[1, 2]", "not json"])
def test_another_tools_manifest_json_in_an_input_directory_is_ignored(tmp_path, run_cli, content):
    src = write_parquet_shards(str(tmp_path / "src"), make_table(10, seed=1))
    Path(src, LEGACY_MANIFEST_NAME).write_text(content)
    result = run_cli("convert", src, tmp_path / "out", "-q")
    assert result.exit_code == 0, result.stderr
    assert len(batchtool.load(src)) == 2  # two shards of one row group each, counted from their footers


@pytest.mark.parametrize("buckets", ["x", [{"bucket": 0}], [1, 2], {"a": 1}])
def test_inspect_shows_a_damaged_bucket_table_as_a_note(dst, run_cli, buckets):
    edit(dst, set_in(("stats", "buckets"), buckets))
    result = run_cli("inspect", dst)
    assert result.exit_code == 0, result.stderr
    assert "stats.buckets: not a per-bucket table" in result.stdout
