"""`batchtool check` end to end: exit codes 0/1/2, the table, JSON and JUnit XML, damaged output shards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchtool.cli import cli
from batchtool.core.synthetic import make_table
from conftest import REPO, SAMPLE, write_parquet_shards

RULES = os.path.join(SAMPLE, "rules.toml")
PARQUET = os.path.join(SAMPLE, "parquet")


def test_sample_rules_pass_with_exit_0(run_cli):
    result = run_cli("check", PARQUET, "--rules", RULES)
    assert result.exit_code == 0, result.output + result.stderr
    lines = result.output.splitlines()
    assert lines[0] == f"check {PARQUET} (parquet, 4,000 rows)"
    assert lines[2].split() == ["rule", "status", "measured", "bound"]
    assert "11 rules: 11 passed, 0 failed" in lines[-1]
    assert "FAIL" not in result.output


def test_failing_flag_rules_exit_1_with_measured_values_and_offenders(run_cli):
    result = run_cli("check", PARQUET, "--num-classes", "3", "--min-rows", "10", "--max-length", "300",
                     "--max-offenders", "2")
    assert result.exit_code == 1
    table = {line.split()[0]: line for line in result.output.splitlines()[3:6]}
    assert table["label_range"].split()[1] == "FAIL" and "41 rows outside [0, 3)" in table["label_range"]
    assert table["row_count"].split()[1] == "PASS"
    assert "max 400" in table["length"]
    assert "first 2 of 41:" in result.output
    assert "part-00000.parquet, row 94, key 'ex-00000094': label 3" in result.output
    assert "3 rules: 1 passed, 2 failed" in result.output


def test_junit_has_one_testcase_per_rule_and_marks_failures(tmp_path, run_cli):
    junit = tmp_path / "check.xml"
    result = run_cli("check", PARQUET, "--rules", RULES, "--num-classes", "3", "--unique", "label",
                     "--junit", junit)
    assert result.exit_code == 1
    root = ET.parse(junit).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases][-2:] == ["label_range", "unique:label"] and len(cases) == 13
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {"label_range", "unique:label"}
    assert "41 rows outside [0, 3)" in failed["label_range"].get("message")
    assert "3,996 rows repeat an earlier key" in failed["unique:label"].get("message")
    assert suites[0].get("tests") == "13" and suites[0].get("failures") == "2" and suites[0].get("errors") == "0"


def test_json_file_and_json_to_stdout(tmp_path, run_cli):
    out = tmp_path / "check.json"
    result = run_cli("check", PARQUET, "--unique", "key", "--no-nulls", "key,label", "--json", out)
    assert result.exit_code == 0 and "rule" in result.output
    data = json.loads(out.read_text())
    assert data["passed"] is True and data["exit_code"] == 0 and data["rows"] == 4000
    assert [(r["name"], r["status"], r["value"]) for r in data["rules"]] == [("unique:key", "PASS", 0),
                                                                            ("no_nulls", "PASS", 0)]
    stdout = run_cli("check", PARQUET, "--num-classes", "2", "--json", "-")
    assert stdout.exit_code == 1
    rule = json.loads(stdout.output)["rules"][0]
    assert rule["status"] == "FAIL" and rule["value"] == 81 + 41 and len(rule["offenders"]) == 5
    assert set(rule["offenders"][0]) == {"detail", "file", "row", "key"}


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_checksums_catch_a_corrupted_output_shard(tmp_path, run_cli, damage):
    dst = tmp_path / "out"
    assert run_cli("convert", PARQUET, dst, "--shard-rows", "1000", "-q").exit_code == 0
    ok = run_cli("check", dst, "--checksums", "--num-classes", "4")
    assert ok.exit_code == 0 and "all 4 files match" in ok.output
    shard = dst / "part-00002.parquet"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(bytes(data[:-7]))
    else:
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
    junit = tmp_path / "check.xml"
    result = run_cli("check", dst, "--checksums", "--num-classes", "4", "--junit", junit)
    assert result.exit_code == 1
    line = next(line for line in result.output.splitlines() if line.startswith("checksums"))
    assert line.split()[1] == "FAIL" and "1 of 4 files differ" in line
    assert ("truncated: " if damage == "truncate" else "changed: sha256") in result.output
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["checksums"].find("failure") is not None


def test_tfrecord_crc(tmp_path, run_cli):
    dst = tmp_path / "tfr"
    assert run_cli("convert", PARQUET, dst, "--to", "tfrecord", "-q").exit_code == 0
    assert run_cli("check", dst, "--crc", "--min-rows", "4000").exit_code == 0
    shard = dst / "part-00000.tfrecord"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    unreadable = run_cli("check", dst, "--num-classes", "4")
    assert unreadable.exit_code == 2 and "data CRC mismatch" in unreadable.stderr
    result = run_cli("check", dst, "--crc", "--num-classes", "4", "--json", "-")
    assert result.exit_code == 1
    crc = json.loads(result.output)["rules"][1]
    assert crc["status"] == "FAIL" and crc["value"] == 1 and "record 0" in crc["offenders"][0]["detail"]


def test_reports_make_their_directories_and_a_data_failure_still_exits_1(tmp_path, run_cli, monkeypatch):
    """A CI job's `--junit reports/ci.xml` before anything made reports/: the check runs, its reports are written
    and its exit status is the data's, nothing else is left beside them."""
    monkeypatch.chdir(tmp_path)
    result = run_cli("check", PARQUET, "--num-classes", "3", "--junit", "reports/ci.xml", "--json", "out/a/b.json")
    assert result.exit_code == 1 and "FAIL" in result.stdout
    assert ET.parse("reports/ci.xml").getroot().get("failures") == "1"
    assert json.loads(open("out/a/b.json").read())["exit_code"] == 1
    assert os.listdir("reports") == ["ci.xml"] and os.listdir("out/a") == ["b.json"]


@pytest.mark.parametrize("report, message", [
    ("afile/ci.xml", "--junit afile/ci.xml: cannot create its directory: {tmp}/afile is not a directory"),
    ("adir", "--junit adir: is a directory; name a file"),
    ("new/", "--junit new/: is a directory; name a file"),
    ("/proc/ci.xml", "--junit /proc/ci.xml: cannot write: No such file or directory"),  # the OS refuses, even root
])
def test_a_report_that_cannot_be_written_stops_the_check_before_it_runs(tmp_path, run_cli, monkeypatch, report,
                                                                       message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("in the way")
    (tmp_path / "adir").mkdir()
    result = run_cli("check", PARQUET, "--num-classes", "3", "--junit", report, "--json", "new/r.json")
    assert result.exit_code == 2 and result.stdout == ""  # no table: the check did not run
    assert result.stderr == f"error: {message.format(tmp=tmp_path)}\n"
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile"] and os.listdir("adir") == []


def test_a_check_that_stops_leaves_reports_as_they_were(tmp_path, run_cli):
    """A usage error found while checking (a rule's column is missing) removes what the reports had made."""
    old = tmp_path / "old.xml"
    old.write_text("<testsuites/>")
    result = run_cli("check", PARQUET, "--unique", "nope", "--junit", old, "--json", tmp_path / "new" / "r.json")
    assert result.exit_code == 2 and "no column 'nope'" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["old.xml"] and old.read_text() == "<testsuites/>"


@pytest.mark.parametrize("args, message", [
    (("check", "/nonexistent/data"), "no rules to check"),
    (("check", "/nonexistent/data", "--num-classes", "4"), "/nonexistent/data: no such file or directory"),
    (("check", PARQUET, "--num-classes", "0"), "--num-classes 0: must be at least 1"),
    (("check", PARQUET, "--target", "0.5,0.6"), "--target 0.5,0.6: probabilities sum to 1.1, expected 1"),
    (("check", PARQUET, "--target", "0.3333,0.3333,0.3333"), "--target 0.3333,0.3333,0.3333: probabilities sum to "
     "0.9999, expected 1 (tolerance 1e-06); fractions such as 1/3 are exact"),
    (("check", PARQUET, "--target", "1/3,1/0"), "--target 1/3,1/0: expected comma-separated probabilities"),
    (("check", PARQUET, "--target", "1/2,1/2", "--num-classes", "4"),
     "--num-classes 4: must be the number of target proportions (2), got 4"),
    (("check", PARQUET, "--no-nulls", "nope"), "no column 'nope'"),
    (("check", PARQUET, "--crc"), "CRCs exist only in TFRecord"),
    (("check", PARQUET, "--checksums"), "not a batchtool output directory"),
    (("check", PARQUET, "--rules", "/nonexistent/rules.toml"), "/nonexistent/rules.toml: no such rules file"),
    (("check", PARQUET, "--min-rows", "1", "--json", "/proc/nonexistent/out.json"),
     "--json /proc/nonexistent/out.json: cannot create its directory: No such file or directory"),
    (("check", PARQUET, "--unique", "label", "--max-offenders", "1000000000"),
     "--max-offenders 1000000000: listing up to 1,000,000,000 offending rows for each of 1 rule takes about 476.8 GB "
     "at once, more than --memory 1.0 GB allows (128.0 MB); give a smaller --max-offenders or a larger --memory"),
])
def test_usage_and_input_errors_exit_2_with_one_line(run_cli, args, message):
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_bad_rules_file_exits_2_naming_the_file_rule_and_key(tmp_path, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nname = "lengths"\nkind = "length"\nmax = "long"\n')
    result = run_cli("check", PARQUET, "--rules", rules)
    assert result.exit_code == 2
    assert f"{rules}: rule 'lengths' (length), key 'max': must be an integer, got string 'long'" in result.stderr


@pytest.mark.parametrize("rule, problem", [
    ('name = "labels"\nkind = "label_range"\ncolumn = "lable"\nnum_classes = 4',
     "rule 'labels' (label_range): {src} has no column 'lable' (did you mean 'label'?)"),
    ('kind = "unique"\ncolumns = ["key", "zzz"]',
     "rule 'unique' (unique): {src} has no column 'zzz' (columns: key, label, weight, tokens, frames)"),
    ('kind = "no_nan"\ncolumns = ["tokens"]',
     "rule 'no_nan' (no_nan): column 'tokens' is list<element: int64>, expected a float or list-of-float column"),
    ('kind = "crc"', "rule 'crc' (crc): {src} is parquet; CRCs exist only in TFRecord files"),
])
def test_a_rule_that_cannot_run_is_named_with_its_rules_file(tmp_path, run_cli, rule, problem):
    """Among other rules, the one whose column is misspelt or of the wrong type is named, with its file."""
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[[rules]]\nkind = "row_count"\nmin = 1\n\n[[rules]]\n{rule}\n')
    result = run_cli("check", PARQUET, "--rules", rules)
    assert result.exit_code == 2
    assert result.stderr == f"error: {rules}: {problem.format(src=PARQUET)}\n"


@pytest.mark.parametrize("args, problem", [
    (("--num-classes", "4", "--label", "lable"),
     "rule 'label_range' (--label lable, --num-classes 4): {src} has no column 'lable' (did you mean 'label'?)"),
    (("--unique", "key,kye"), "rule 'unique:key,kye' (--unique key,kye): {src} has no column 'kye' (did you mean "
                              "'key'?)"),
    (("--length", "tokns", "--max-length", "5"),
     "rule 'length' (--length tokns, --max-length 5): {src} has no column 'tokns' (did you mean 'tokens'?)"),
])
def test_a_rule_flag_that_cannot_run_is_named_with_its_flags(run_cli, args, problem):
    result = run_cli("check", PARQUET, *args)
    assert result.exit_code == 2
    assert result.stderr == f"error: {problem.format(src=PARQUET)}\n"


def test_check_and_stratify_read_target_alike(tmp_path, run_cli):
    """One parser and one tolerance: 'uniform' is the fractions it stands for, and what stratify refuses check
    refuses in the same words."""
    tables = [run_cli("check", PARQUET, "--target", t, "--json", "-") for t in ("uniform", "1/4,1/4,1/4,1/4")]
    assert [r.exit_code for r in tables] == [1, 1]
    assert [json.loads(r.stdout)["rules"][0]["measured"] for r in tables] == [
        "max deviation 0.6505 (class 0: 0.9005, target 0.2500)"] * 2
    for target in ("0.3333,0.3333,0.3333", "1/3,1/3,1/0"):
        errors = [run_cli(*command, "--target", target).stderr for command in (
            ("check", PARQUET), ("stratify", PARQUET, tmp_path / "dst", "--label", "label"))]
        problems = [e.partition(f"{target}': " if "'" in e else f"{target}: ")[2] for e in errors]
        assert problems[0] == problems[1] and errors[0].startswith(f"error: --target {target}: ") and problems[0]
    assert run_cli("stratify", PARQUET, tmp_path / "dst", "--target", "1/4,1/4,1/4,1/4", "-q").exit_code == 0


def test_padding_efficiency_on_output_without_it_exits_2(tmp_path, run_cli):
    dst = tmp_path / "out"
    assert run_cli("convert", PARQUET, dst, "-q").exit_code == 0
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nkind = "padding_efficiency"\nmin = 0.9\n')
    result = run_cli("check", dst, "--rules", rules)
    assert result.exit_code == 2 and "no stats.padding_efficiency" in result.stderr


def test_schema_failure_reports_dependent_rules_as_not_evaluated(tmp_path, run_cli):
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"key": ["a", "b"]}), shards=1)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nkind = "schema"\ncolumns = { label = "int64" }\n')
    junit = tmp_path / "check.xml"
    result = run_cli("check", src, "--rules", rules, "--num-classes", "2", "--junit", junit)
    assert result.exit_code == 1
    assert "1 failed, 1 not evaluated" in result.output
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["schema"].find("failure") is not None and cases["label_range"].find("error") is not None


@pytest.mark.parametrize("form", [("--no-nan", "weight,frames"), ("--no-nan", "weight", "--no-nan", "frames")])
def test_no_nan_flag_takes_repeated_and_comma_separated_columns(tmp_path, run_cli, form):
    result = run_cli("check", PARQUET, *form, "--json", "-")
    assert result.exit_code == 0
    rule = json.loads(result.output)["rules"][0]
    assert (rule["name"], rule["kind"], rule["status"], rule["bound"]) == ("no_nan", "no_nan", "PASS",
                                                                          "0 NaNs in weight, frames")
    src = write_parquet_shards(str(tmp_path / "nan"), pa.table({"x": [1.0, float("nan"), 2.0],
                                                                "y": [[0.5], [1.0], [float("nan")]]}), shards=1)
    bad = run_cli("check", src, *[a.replace("weight", "x").replace("frames", "y") for a in form])
    assert bad.exit_code == 1
    assert "2 NaNs (x: 1, y: 1)" in bad.output and "row 1: NaN in 'x'" in bad.output


def test_counts_are_in_the_right_number(tmp_path, run_cli):
    src = write_parquet_shards(str(tmp_path / "one"), pa.table({"key": ["a"], "label": [0]}), shards=1)
    result = run_cli("check", src, "--unique", "key")
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == f"check {src} (parquet, 1 row)"
    assert "the only key distinct" in result.output
    assert result.output.splitlines()[-1].startswith("1 rule: 1 passed, 0 failed")
    dst = tmp_path / "out"
    assert run_cli("convert", src, dst, "-q").exit_code == 0
    verified = run_cli("check", dst, "--checksums")
    assert "the only file matches" in verified.output and "all 1 file" not in verified.output
    assert not re.search(r"\b1 (rules|files|rows|batches|columns)\b", verified.output + result.output)


def test_statuses_are_plain_when_not_a_terminal_and_coloured_when_forced(monkeypatch):
    args = ["check", PARQUET, "--num-classes", "3", "--min-rows", "1"]
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 1 and "\x1b[" not in plain.output
    coloured = CliRunner().invoke(cli, args, color=True)
    assert click.style("PASS", fg="green") in coloured.output and click.style("FAIL", fg="red") in coloured.output
    assert click.unstyle(coloured.output).splitlines()[:-1] == plain.output.splitlines()[:-1]  # not the time
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in CliRunner().invoke(cli, args, color=True).output


def test_a_piped_check_prints_no_escape_codes():
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("NO_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "batchtool", "check", PARQUET, "--num-classes", "4"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0 and "PASS" in proc.stdout and "\x1b[" not in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("1 rule: 1 passed, 0 failed")


@pytest.mark.parametrize("target", [
    ["--json", "{src}/part-00000.parquet"],
    ["--junit", "{src}/report.xml"],
    ["--junit", "{rules}"],
    ["--tmp-dir", "{src}/spill"],
    ["--json", "{tmp}/r.out", "--junit", "{tmp}/./r.out"],
], ids=["json-over-a-shard", "junit-inside-src", "junit-over-the-rules", "tmp-dir-inside-src", "one-file-twice"])
@pytest.mark.parametrize("glob", [False, True])
def test_reports_never_overwrite_what_check_reads(tmp_path, run_cli, target, glob):
    src = write_parquet_shards(str(tmp_path / "src"), make_table(40, seed=1))
    rules = tmp_path / "rules.toml"
    rules.write_text("[[rule]]\nkind = \"row_count\"\nmin = 1\n")
    before = {p: open(p, "rb").read() for p in [str(rules)] + [os.path.join(src, f) for f in os.listdir(src)]}
    spec = os.path.join(src, "*.parquet") if glob else src
    args = [a.format(src=src, rules=rules, tmp=tmp_path) for a in target]
    result = run_cli("check", spec, "--rules", str(rules), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    after = {p: open(p, "rb").read() for p in before}
    assert after == before
    assert sorted(os.listdir(src)) == ["part-00000.parquet", "part-00001.parquet"]
    assert not os.path.exists(tmp_path / "r.out")


@pytest.mark.parametrize("args", [("check", "--length", "n", "--max-length", "4"),
                                  ("bucket", "DST", "--length", "n", "--boundaries", "5", "--batch-size", "2")])
def test_a_negative_length_names_its_file_row_and_column(tmp_path, run_cli, args):
    """A length column's values size the length histogram: a negative one is refused where it is, not as a bare
    `column 'n' has a negative length`."""
    n = np.arange(20)
    n[7] = -3
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"n": n, "tokens": pa.array([[1, 2, 3]] * 20)}), src / "part-0.parquet")
    result = run_cli(args[0], src, *[tmp_path / "dst" if a == "DST" else a for a in args[1:]])
    assert result.exit_code == 2
    assert result.stderr == f"error: {src}/part-0.parquet, row 7, column 'n': a negative length (-3)\n"
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize("args", [("--num-classes", "4"), ("--baseline", "SRC")])
def test_a_label_column_of_more_values_than_classes_is_refused_not_counted_whole(tmp_path, run_cli, args):
    """Label counts are per class: a column of 100,000 distinct values (an id, say) would grow them with the data."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"label": np.arange(100_000)}), src / "part-0.parquet", row_group_size=10_000)
    result = run_cli("check", src, *[src if a == "SRC" else a for a in args])
    assert result.exit_code == 2 and result.stderr == (
        f"error: {src}: column 'label' holds more than 65,536 distinct labels; the label rules count rows per class "
        "(check the label column)\n")
