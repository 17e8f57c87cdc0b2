"""`batchtool check --baseline`, end to end: drift of class proportions, length quantiles, null shares and row
count against another dataset, a batchtool output or its manifest, within tolerances; text, JSON and JUnit."""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pytest

from batchtool.core.synthetic import make_table
from conftest import write_parquet_shards

DRIFT = ["drift_rows", "drift_proportions", "drift_lengths", "drift_nulls"]


def corpus(labels: list[int], lengths: list[int], weight_nulls: int = 0) -> pa.Table:
    n = len(labels)
    return pa.table({
        "key": [f"k{i}" for i in range(n)],
        "label": pa.array(labels, pa.int64()),
        "weight": pa.array([None] * weight_nulls + [1.0] * (n - weight_nulls), pa.float32()),
        "tokens": pa.array([[1] * m for m in lengths], pa.list_(pa.int64())),
    })


@pytest.fixture
def base(tmp_path) -> str:
    """100 rows: labels 80% 0, 20% 1; every sequence 10 steps; no nulls."""
    return write_parquet_shards(str(tmp_path / "base"), corpus([0] * 80 + [1] * 20, [10] * 100))


@pytest.fixture
def drifted(tmp_path) -> str:
    """100 rows: labels 70/30; half the sequences 12 steps; 5 null weights."""
    return write_parquet_shards(str(tmp_path / "new"), corpus([0] * 70 + [1] * 30, [10, 12] * 50, weight_nulls=5))


def rules_of(result) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(result.output)["rules"]}


def test_the_same_data_in_another_format_does_not_drift(tmp_path, parquet_src, run_cli):
    tfrecord = tmp_path / "tfr"
    assert run_cli("convert", parquet_src, tfrecord, "--to", "tfrecord", "-q").exit_code == 0
    result = run_cli("check", parquet_src, "--baseline", tfrecord, "--json", "-")
    assert result.exit_code == 0, result.output + result.stderr
    rules = rules_of(result)
    assert list(rules) == DRIFT
    assert [(r["status"], r["value"]) for r in rules.values()] == [("PASS", 1.0), ("PASS", 0.0), ("PASS", 0.0),
                                                                  ("PASS", 0.0)]
    assert rules["drift_lengths"]["measured"].startswith("tokens: p50 ")
    assert rules["drift_nulls"]["measured"] == "same null shares in 5 columns"


def test_each_drift_rule_measures_the_difference_from_the_baseline(base, drifted, run_cli):
    result = run_cli("check", drifted, "--baseline", base, "--json", "-")
    assert result.exit_code == 1
    rules = rules_of(result)
    assert {n: (r["status"], r["value"]) for n, r in rules.items()} == {
        "drift_rows": ("PASS", 1.0), "drift_proportions": ("FAIL", 0.1), "drift_lengths": ("FAIL", 0.2),
        "drift_nulls": ("FAIL", 0.05)}
    assert [o["detail"] for o in rules["drift_proportions"]["offenders"]] == [
        "class 0: 0.7000 of labels, baseline 0.8000 (difference 0.1000)",
        "class 1: 0.3000 of labels, baseline 0.2000 (difference 0.1000)"]
    assert rules["drift_lengths"]["measured"] == ("tokens: p50 10 (baseline 10), p90 12 (baseline 10), "
                                                  "p99 12 (baseline 10)")
    assert [o["detail"] for o in rules["drift_lengths"]["offenders"]] == [
        "p90: 12, baseline 10 (relative difference 0.2000)", "p99: 12, baseline 10 (relative difference 0.2000)"]
    assert [o["detail"] for o in rules["drift_nulls"]["offenders"]] == [
        "weight: 0.0500 null, baseline 0.0000 (difference 0.0500)"]
    assert rules["drift_proportions"]["bound"] == "|share - baseline share| <= 0.02 per class"


def test_tolerance_flags_loosen_each_rule(base, drifted, run_cli):
    loose = run_cli("check", drifted, "--baseline", base, "--tolerance", "proportions=0.11",
                    "--tolerance", "lengths=0.25", "--tolerance", "nulls=0.06", "--tolerance", "rows=0")
    assert loose.exit_code == 0, loose.output
    assert "|share - baseline share| <= 0.11 per class" in loose.output
    assert "rows / baseline rows in [1, 1]" in loose.output
    # a bare number stays the --target tolerance, beside the drift ones
    both = run_cli("check", drifted, "--baseline", base, "--target", "0.7,0.3", "--tolerance", "0.001",
                   "--tolerance", "proportions=0.2", "--json", "-")
    assert {n: r["status"] for n, r in rules_of(both).items()}["class_proportions"] == "PASS"
    assert rules_of(both)["drift_proportions"]["bound"] == "|share - baseline share| <= 0.2 per class"


def test_row_count_ratio(tmp_path, base, run_cli):
    small = write_parquet_shards(str(tmp_path / "small"), corpus([0] * 85, [10] * 85))
    result = run_cli("check", small, "--baseline", base, "--json", "-")
    rule = rules_of(result)["drift_rows"]
    assert (rule["status"], rule["value"], rule["measured"]) == ("FAIL", 0.85,
                                                                 "85 rows, baseline 100 (ratio 0.8500)")
    assert run_cli("check", small, "--baseline", base, "--tolerance", "rows=0.15", "--tolerance",
                   "proportions=0.2").exit_code == 0  # 85 of 100 is within 0.15, float noise aside


def test_junit_report_has_a_testcase_per_drift_rule(tmp_path, base, drifted, run_cli):
    junit = tmp_path / "drift.xml"
    assert run_cli("check", drifted, "--baseline", base, "--junit", junit).exit_code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == DRIFT and suite.get("failures") == "3"
    failure = cases["drift_nulls"].find("failure")
    assert failure.get("type") == "drift_nulls"
    assert "weight: 0.0500 null, baseline 0.0000" in failure.text


def test_rules_file_drift_rules_with_their_own_keys_and_baseline(tmp_path, base, drifted, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text(f'baseline = "{base}"\n'
                     '[[rules]]\nname = "labels"\nkind = "drift_proportions"\ncolumn = "label"\ntolerance = 0.15\n'
                     '[[rules]]\nkind = "drift_nulls"\ncolumns = ["key", "label"]\n')
    result = run_cli("check", drifted, "--rules", rules)
    assert result.exit_code == 0, result.output
    assert re.search(r"^labels +PASS", result.output, re.M) and re.search(r"^drift_nulls +PASS", result.output, re.M)
    assert "2 rules: 2 passed" in result.output
    # --baseline overrides the file's, and adds no rules of its own beside the file's drift rules
    other = run_cli("check", drifted, "--rules", rules, "--baseline", drifted)
    assert other.exit_code == 0 and "2 rules: 2 passed" in other.output
    refused = run_cli("check", drifted, "--rules", rules, "--baseline", base, "--tolerance", "nulls=0.5")
    assert refused.exit_code == 2
    assert "--tolerance nulls=0.5: the rules file has its own drift rules; set their tolerance there" in refused.stderr


@pytest.fixture
def stratified(tmp_path, run_cli) -> str:
    table = make_table(200, seed=7)
    table = table.set_column(1, "label", pa.array(np.arange(200) % 4, pa.int64()))
    src = write_parquet_shards(str(tmp_path / "classes"), table)
    dst = str(tmp_path / "stratified")
    assert run_cli("stratify", src, dst, "--target", "0.4,0.3,0.2,0.1", "-q").exit_code == 0
    return dst


def test_a_baseline_manifest_answers_from_its_stats_without_reading_its_data(tmp_path, stratified, run_cli):
    copy = shutil.copytree(stratified, tmp_path / "copy")
    part = copy / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:100])  # unreadable: any read of the baseline's data would stop the check
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nkind = "drift_rows"\n[[rules]]\nkind = "drift_proportions"\ntolerance = 0\n')
    result = run_cli("check", stratified, "--rules", rules, "--baseline", copy / ".batchtool_manifest.json", "--json", "-")
    assert result.exit_code == 0, result.output + result.stderr
    assert [(r["status"], r["value"]) for r in rules_of(result).values()] == [("PASS", 1.0), ("PASS", 0.0)]
    # lengths and null shares are not in the manifest: they need the (here unreadable) data
    unreadable = run_cli("check", stratified, "--baseline", copy / ".batchtool_manifest.json")
    assert unreadable.exit_code == 2 and "part-00000.parquet" in unreadable.stderr


def test_a_manifest_without_its_data_skips_what_it_does_not_record(tmp_path, stratified, run_cli):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(os.path.join(stratified, ".batchtool_manifest.json"), alone / ".batchtool_manifest.json")
    result = run_cli("check", stratified, "--baseline", alone / ".batchtool_manifest.json", "--json", "-")
    assert result.exit_code == 0
    rules = rules_of(result)
    assert [r["status"] for r in rules.values()] == ["PASS", "PASS", "SKIP", "SKIP"]
    assert rules["drift_lengths"]["measured"] == (f"the baseline manifest {alone / '.batchtool_manifest.json'} records no "
                                                  "lengths and has no data beside it to count them")
    assert json.loads(result.output)["counts"] == {"pass": 2, "fail": 0, "error": 0, "skip": 2}


def test_a_batchtool_output_directory_is_a_baseline_too(stratified, run_cli):
    result = run_cli("check", stratified, "--baseline", stratified)
    assert result.exit_code == 0 and "4 rules: 4 passed" in result.output


def test_no_label_column_skips_the_proportions(tmp_path, run_cli):
    src = write_parquet_shards(str(tmp_path / "nolabel"), pa.table({"tokens": pa.array([[1, 2], [3]])}), shards=1)
    result = run_cli("check", src, "--baseline", src, "--json", "-")
    assert result.exit_code == 0
    rule = rules_of(result)["drift_proportions"]
    assert rule["status"] == "SKIP"
    assert rule["measured"] == "SRC has no integer 'label' column to compare (set the rule's column, or pass " \
                               "--label COL)"


@pytest.mark.parametrize("args, message", [
    (("--tolerance", "proportions=0.1"), "--tolerance proportions=0.1: applies to --baseline, which is not given"),
    (("--baseline", "BASE", "--tolerance", "shares=0.1"),
     "--tolerance shares=0.1: unknown key (expected one of: rows, proportions, lengths, nulls, or a number for "
     "--target)"),
    (("--baseline", "BASE", "--tolerance", "rows=abc"), "--tolerance rows=abc: not a number or KEY=NUMBER"),
    (("--baseline", "BASE", "--tolerance", "rows=-1"), "a tolerance must be a number >= 0"),
    (("--baseline", "/nonexistent/base"), "/nonexistent/base: no such file or directory"),
    (("--baseline", "BASE", "--label", "key"), "rule 'drift_proportions' (--label key): column 'key' of the baseline "),
])
def test_drift_usage_errors_exit_2_with_one_line(base, drifted, run_cli, args, message):
    result = run_cli("check", drifted, *[base if a == "BASE" else a for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr



@pytest.mark.parametrize("args, message", [
    (("--label", "key"), "rule 'drift_proportions' (--label key): column 'key' of the baseline BASE is string, "
                         "expected an integer label column"),
    (("--length", "key"), "rule 'drift_lengths' (--length key): column 'key' of the baseline BASE is string, expected "
                          "a list column or an integer length column"),
    (("--length", "nope"), "rule 'drift_lengths' (--length nope): the baseline BASE has no column 'nope' (columns: "
                           "key, label, weight, tokens)"),
    (("--length", "tokns"), "rule 'drift_lengths' (--length tokns): the baseline BASE has no column 'tokns' (did you "
                            "mean 'tokens'?)"),
])
def test_a_baseline_column_is_checked_like_a_column_of_src(base, drifted, run_cli, args, message):
    result = run_cli("check", drifted, "--baseline", base, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {message.replace('BASE', base)}\n"

def test_drift_rules_in_a_file_need_a_baseline(tmp_path, drifted, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nkind = "drift_rows"\n')
    result = run_cli("check", drifted, "--rules", rules)
    assert result.exit_code == 2
    assert f"error: {rules}: rule 'drift_rows' (drift_rows): compares SRC with a baseline: pass --baseline OTHER" \
        in result.stderr
    rules.write_text('baseline = "x"\n[[rules]]\nkind = "row_count"\nmin = 1\n')
    result = run_cli("check", drifted, "--rules", rules)
    assert result.exit_code == 2 and "top-level key 'baseline' is set but no rule compares with it" in result.stderr


def test_a_baseline_length_that_would_size_a_huge_histogram_is_refused_naming_its_row(tmp_path, base, run_cli):
    """A length is checked against --memory before the baseline's length histogram is allocated, as SRC's is."""
    table = corpus([0, 1] * 5, [10] * 10).append_column("n", pa.array([10] * 7 + [10 ** 12] + [10] * 2, pa.int64()))
    huge = write_parquet_shards(str(tmp_path / "huge"), table, shards=1)
    ok = table.set_column(table.schema.get_field_index("n"), "n", pa.array([10] * 10, pa.int64()))
    src = write_parquet_shards(str(tmp_path / "ok"), ok, shards=1)
    result = run_cli("check", src, "--baseline", huge, "--length", "n")
    assert result.exit_code == 2 and result.stderr == (
        f"error: {huge}/part-00000.parquet, row 7, column 'n': a length of 1,000,000,000,000: counting lengths up to "
        "it takes 40,000,000,000,040 bytes, more than --memory allows (134,217,728); check the column, or raise --memory "
        "if the length is genuine\n")
