"""`batchtool check` on batchtool output, end to end: verification against the manifest when no rule is given,
and the batch-level rules (padding per bucket, rows per batch, balanced quotas, equal batches per rank)."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchtool import load
from batchtool.core.synthetic import make_table
from conftest import SAMPLE, data_bytes, write_parquet_shards


def table(result) -> dict[str, list[str]]:
    """The rules table of a check's text output: rule name -> [status, measured, bound]."""
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rule", "status"]) + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        name, status, *cells = re.split(r"\s{2,}", line.strip())
        rows[name] = [status, *cells]
    return rows


def rules_of(result) -> dict[str, dict]:
    """Rules of a `check --json -` output by name."""
    return {r["name"]: r for r in json.loads(result.output)["rules"]}


@pytest.fixture
def bucketed(tmp_path, parquet_src, run_cli) -> str:
    """bucket output of 300 rows in 3 Parquet files (the tests rewrite them): buckets < 20, [20, 40), >= 40,
    batches of 16."""
    dst = str(tmp_path / "bucketed")
    assert run_cli("bucket", parquet_src, dst, "--length", "tokens", "--boundaries", "20,40", "--batch-size", "16",
                   "--shard-rows", "100", "--to", "parquet", "-q").exit_code == 0
    return dst


@pytest.fixture
def balanced(tmp_path, run_cli) -> str:
    """stratify --balanced-batches output, in Parquet (a test rewrites it): 125 rows of 4 classes (0.4/0.3/0.2/0.1)
    in 12 batches of 10 and one of 5."""
    corpus = make_table(200, seed=7)
    corpus = corpus.set_column(1, "label", pa.array(np.arange(200) % 4, pa.int64()))
    src = write_parquet_shards(str(tmp_path / "classes"), corpus)
    dst = str(tmp_path / "balanced")
    assert run_cli("stratify", src, dst, "--target", "0.4,0.3,0.2,0.1", "--batch-size", "10", "--balanced-batches",
                   "--to", "parquet", "-q").exit_code == 0
    return dst


def manifest_of(dst: str) -> dict:
    return json.loads(open(os.path.join(dst, ".batchtool_manifest.json")).read())


def rewrite_manifest(dst: str, change) -> None:
    manifest = manifest_of(dst)
    change(manifest)
    with open(os.path.join(dst, ".batchtool_manifest.json"), "w") as f:
        json.dump(manifest, f)


# ------------------------------------------------------------------------------ verification by default

@pytest.mark.parametrize("to", ["parquet", "tfrecord", "arrow"])
def test_no_rule_on_a_batchtool_output_verifies_it_against_its_manifest(tmp_path, parquet_src, run_cli, to):
    dst = str(tmp_path / "out")
    assert run_cli("bucket", parquet_src, dst, "--length", "tokens", "--boundaries", "20,40", "--batch-size", "16",
                   "--shard-rows", "100", "--to", to, "-q").exit_code == 0
    before = data_bytes(dst)
    result = run_cli("check", dst)
    assert result.exit_code == 0, result.output + result.stderr
    rows = table(result)
    assert list(rows) == ["checksums", "manifest_rows", "manifest_batches", "manifest_schema"]
    assert rows["checksums"][:2] == ["PASS", "all 3 files match"]
    assert rows["manifest_rows"] == ["PASS", "300 rows in 3 files, as listed", "rows per file as in the manifest"]
    assert rows["manifest_batches"] == ["PASS", "20 batches in 3 files, as listed",
                                        "batches per file as in the manifest"]
    assert rows["manifest_schema"] == ["PASS", "all 3 files have the manifest's 8 columns", "schema as in the manifest"]
    assert result.output.splitlines()[-1].startswith("4 rules: 4 passed, 0 failed")
    assert data_bytes(dst) == before and sorted(os.listdir(dst)) == sorted([*before, ".batchtool_manifest.json",
                                                                           ".batchtool_index"])


def test_tfrecord_without_a_batch_column_skips_the_batch_count(tmp_path, run_cli):
    dst = tmp_path / "tfr"
    assert run_cli("convert", os.path.join(SAMPLE, "parquet"), dst, "--to", "tfrecord", "-q").exit_code == 0
    junit = tmp_path / "check.xml"
    result = run_cli("check", dst, "--junit", junit)
    assert result.exit_code == 0
    assert table(result)["manifest_batches"] == ["SKIP", "TFRecord records without a 'batch' column mark no batches",
                                                 "-"]
    assert result.output.splitlines()[-1].startswith("4 rules: 3 passed, 0 failed, 1 skipped")
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("skipped") == "1" and suite.get("failures") == "0"
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert skipped == ["manifest_batches"]


def test_rows_and_batches_that_differ_from_the_manifest_fail(bucketed, run_cli):
    def change(manifest):
        manifest["output"]["files"][1]["rows"] += 1
        manifest["output"]["files"][2]["batches"] = 9
    rewrite_manifest(bucketed, change)
    result = run_cli("check", bucketed, "--json", "-")
    assert result.exit_code == 1
    rules = rules_of(result)
    assert [rules[n]["status"] for n in rules] == ["PASS", "FAIL", "FAIL", "PASS"]
    assert rules["manifest_rows"]["measured"] == "1 of 3 files differ; the manifest's total differs"
    assert [o["detail"] for o in rules["manifest_rows"]["offenders"]] == [
        "103 rows, the manifest says 104", "the manifest's output.rows is 300, its files add up to 301"]
    assert rules["manifest_rows"]["offenders"][0]["file"].endswith("part-00001.parquet")
    assert [o["detail"] for o in rules["manifest_batches"]["offenders"]] == [
        "6 batches, the manifest says 9", "the manifest's output.batches is 20, its files add up to 23"]


def test_a_replaced_file_fails_checksums_rows_batches_and_schema(bucketed, run_cli):
    part = os.path.join(bucketed, "part-00002.parquet")
    pq.write_table(pa.table({"key": ["a", "b"]}), part)
    result = run_cli("check", bucketed)
    assert result.exit_code == 1
    assert {name: row[0] for name, row in table(result).items()} == {
        "checksums": "FAIL", "manifest_rows": "FAIL", "manifest_batches": "FAIL", "manifest_schema": "FAIL"}
    assert f"{part}: 2 rows, the manifest says 85" in result.output
    assert f"{part}: 1 batch, the manifest says 6" in result.output
    assert f"{part}: column 'label' missing" in result.output


def test_a_missing_file_is_reported_not_followed(bucketed, run_cli):
    os.remove(os.path.join(bucketed, "part-00000.parquet"))
    result = run_cli("check", bucketed)
    assert result.exit_code == 1
    assert table(result)["manifest_rows"][:2] == ["FAIL", "1 of 3 files differ"]
    assert "part-00000.parquet: missing" in result.output


@pytest.mark.parametrize("path", ["../src/part-00000.parquet", "/etc/passwd", "link.parquet"])
@pytest.mark.parametrize("flag", ["--manifest", "--checksums"])
def test_a_manifest_path_leaving_the_directory_is_refused(bucketed, parquet_src, run_cli, path, flag):
    os.symlink(os.path.join(parquet_src, "part-00000.parquet"), os.path.join(bucketed, "link.parquet"))
    rewrite_manifest(bucketed, lambda m: m["output"]["files"][0].update(path=path))
    result = run_cli("check", bucketed, flag)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"output.files[0].path {path!r}" in result.stderr
    assert ("leaves the dataset directory" in result.stderr) != ("is absolute" in result.stderr)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_a_damaged_or_missing_example_index_is_a_data_failure_naming_it(bucketed, run_cli, damage):
    index = os.path.join(bucketed, ".batchtool_index")
    data = open(index, "rb").read()
    if damage == "missing":
        os.remove(index)
    else:
        with open(index, "wb") as f:
            f.write(data[:-1] if damage == "truncated" else data[:100] + bytes([data[100] ^ 1]) + data[101:])
    result = run_cli("check", bucketed, "--json", "-")
    assert result.exit_code == 1
    rules = rules_of(result)
    assert [rules[n]["status"] for n in rules] == ["FAIL", "PASS", "PASS", "PASS"]
    assert rules["checksums"]["measured"] == "the example index differs"
    [offender] = rules["checksums"]["offenders"]
    assert offender["file"] == index
    assert offender["detail"].startswith({"flipped": "the example index: changed: sha256 ",
                                          "truncated": f"the example index: truncated: {len(data) - 1:,} bytes",
                                          "missing": "the example index: missing"}[damage])


def test_a_damaged_data_file_and_index_are_both_named(bucketed, run_cli):
    with open(os.path.join(bucketed, ".batchtool_index"), "ab") as f:
        f.write(b"x")
    with open(os.path.join(bucketed, "part-00001.parquet"), "ab") as f:
        f.write(b"x")
    result = run_cli("check", bucketed, "--checksums")
    assert result.exit_code == 1
    assert table(result)["checksums"][:2] == ["FAIL", "1 of 3 files differ; the example index differs"]


@pytest.mark.parametrize("entry, field", [
    ({"path": "../elsewhere"}, "output.index.path '../elsewhere'"), ({"sha256": 7}, "output.index.sha256 is 7"),
    ({"bytes": -1}, "output.index.bytes is -1"), ({"path": "part-00000.parquet"}, "is also a data file")])
def test_a_hostile_index_entry_is_refused(bucketed, run_cli, entry, field):
    rewrite_manifest(bucketed, lambda m: m["output"]["index"].update(entry))
    result = run_cli("check", bucketed)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert field in result.stderr


def test_manifest_flag_adds_the_verification_to_other_rules(bucketed, run_cli):
    result = run_cli("check", bucketed, "--manifest", "--num-classes", "4")
    assert result.exit_code == 0
    assert list(table(result)) == ["label_range", "checksums", "manifest_rows", "manifest_batches", "manifest_schema"]


def test_no_rule_and_no_manifest_stays_a_usage_error(run_cli):
    result = run_cli("check", os.path.join(SAMPLE, "parquet"))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no rules to check: pass --rules FILE or rule flags")


# ---------------------------------------------------------------------------------------- batch rules

def test_padding_efficiency_per_bucket_from_the_manifest(bucketed, run_cli):
    ok = run_cli("check", bucketed, "--min-bucket-padding-efficiency", "0.5", "--min-padding-efficiency", "0.6")
    assert ok.exit_code == 0
    assert table(ok)["padding_efficiency:buckets"] == ["PASS", "worst bucket 2 (lengths 40-): 0.5381",
                                                       ">= 0.5 in every bucket"]
    assert table(ok)["padding_efficiency"] == ["PASS", "0.6101", ">= 0.6"]
    bad = run_cli("check", bucketed, "--min-bucket-padding-efficiency", "0.7", "--json", "-")
    assert bad.exit_code == 1
    rule = json.loads(bad.output)["rules"][0]
    assert (rule["status"], rule["value"], rule["offending"]) == ("FAIL", 0.538121, 2)
    assert [o["detail"] for o in rule["offenders"]] == ["bucket 0 (lengths 0-19): 0.6688 (6 batches)",
                                                        "bucket 2 (lengths 40-): 0.5381 (6 batches)"]


def test_rules_file_keys_of_the_batch_rules(tmp_path, bucketed, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nkind = "padding_efficiency"\nmin = 0.5\nper_bucket = true\n'
                     '[[rules]]\nkind = "batch_rows"\nmin = 1\nmax = 16\n'
                     '[[rules]]\nkind = "rank_batches"\n')
    result = run_cli("check", bucketed, "--rules", rules)
    assert result.exit_code == 0
    assert {n: r[0] for n, r in table(result).items()} == {"padding_efficiency": "PASS", "batch_rows": "PASS",
                                                            "rank_batches": "SKIP"}


def test_rows_per_batch_within_bounds(bucketed, run_cli):
    result = run_cli("check", bucketed, "--min-batch-rows", "16", "--max-batch-rows", "16")
    assert result.exit_code == 1
    assert table(result)["batch_rows"] == ["FAIL", "7-16 rows in 20 batches", "[16, 16] rows per batch"]
    offenders = [line.strip() for line in result.output.splitlines() if line.startswith("    batch ")]
    loaded = [len(b["key"]) for b in load(bucketed, shuffle=False)]
    assert len(loaded) == 20
    assert offenders == [f"batch {i}: {n} rows" for i, n in enumerate(loaded) if n != 16][:5]
    assert run_cli("check", bucketed, "--max-batch-rows", "16").exit_code == 0


def test_batch_quotas_of_a_balanced_output(balanced, run_cli):
    ok = run_cli("check", balanced, "--batch-quotas")
    assert ok.exit_code == 0
    assert table(ok)["batch_quotas"][:2] == ["PASS", "every batch of 13 holds its quotas"]
    # move one row from batch 0 to batch 1 and one back, changing the classes of both batches
    data = pq.read_table(os.path.join(balanced, "part-00000.parquet"))
    labels = data.column("label").to_pylist()
    i = 0
    j = next(k for k in range(10, 20) if labels[k] != labels[i])
    order = list(range(len(labels)))
    order[i], order[j] = j, i
    swapped = data.take(order)
    with pq.ParquetWriter(os.path.join(balanced, "part-00000.parquet"), swapped.schema) as writer:
        for start in range(0, swapped.num_rows, 10):
            writer.write_table(swapped.slice(start, 10))
    bad = run_cli("check", balanced, "--batch-quotas")
    assert bad.exit_code == 1
    assert table(bad)["batch_quotas"][:2] == ["FAIL", "2 of 13 batches off their quotas"]
    assert "    batch 0: classes" in bad.output and "    batch 1: classes" in bad.output


def test_batch_quotas_on_other_output_is_a_usage_error(bucketed, run_cli):
    result = run_cli("check", bucketed, "--batch-quotas", "--min-batch-rows", "16")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "records no stats.balanced_batches (written by 'bucket'; stratify --balanced-batches" in result.stderr


def ranked(path, batches_per_rank: list[int]) -> str:
    """A Parquet dataset with a rank column: each batch of each rank is one row group of 4 rows."""
    path.mkdir()
    schema = pa.schema([("rank", pa.int32()), ("x", pa.int64())])
    with pq.ParquetWriter(path / "part-00000.parquet", schema) as writer:
        for rank, n in enumerate(batches_per_rank):
            for _ in range(n):
                writer.write_table(pa.table({"rank": pa.array([rank] * 4, pa.int32()), "x": list(range(4))}))
    return str(path)


def test_equal_batches_per_rank_from_a_rank_column(tmp_path, run_cli):
    src = ranked(tmp_path / "uneven", [3, 3, 2])
    result = run_cli("check", src, "--rank-batches", "--json", "-")
    assert result.exit_code == 1
    rule = json.loads(result.output)["rules"][0]
    assert rule["value"] == {"0": 3, "1": 3, "2": 2}
    assert [o["detail"] for o in rule["offenders"]] == ["rank 2: 2 batches, rank 0 has 3"]
    ok = run_cli("check", ranked(tmp_path / "even", [2, 2]), "--rank-batches")
    assert ok.exit_code == 0 and "2 ranks, 2 batches each (from the column 'rank')" in ok.output


def test_equal_batches_per_rank_from_per_rank_manifest_entries(bucketed, run_cli):
    rewrite_manifest(bucketed, lambda m: [f.update(rank=i % 2) for i, f in enumerate(m["output"]["files"])])
    result = run_cli("check", bucketed, "--rank-batches")  # rank 0: files 0 and 2 (13 batches), rank 1: 7
    assert result.exit_code == 1
    assert table(result)["rank_batches"][:2] == ["FAIL", "2 ranks, 7-13 batches (from the manifest)"]
    assert "rank 1: 7 batches, rank 0 has 13" in result.output


def test_equal_batches_per_rank_without_ranks_is_skipped(bucketed, run_cli):
    result = run_cli("check", bucketed, "--rank-batches")
    assert result.exit_code == 0
    assert table(result)["rank_batches"][0] == "SKIP"
    assert "no rank layout: no 'rank' column and no per-rank files in the manifest" in result.output
    assert result.output.splitlines()[-1].startswith("1 rule: 0 passed, 0 failed, 1 skipped")


def test_a_run_output_is_judged_by_its_last_stage(tmp_path, parquet_src, run_cli):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(f'[input]\npath = "{parquet_src}"\n\n[[stage]]\nop = "stratify"\n'
                        f'target = "0.7,0.2,0.05,0.05"\n\n[[stage]]\nop = "bucket"\nlength = "tokens"\n'
                        f'boundaries = "20"\nbatch-size = 8\n\n[output]\npath = "{tmp_path / "run"}"\n')
    assert run_cli("run", pipeline, "-q").exit_code == 0
    manifest = manifest_of(str(tmp_path / "run"))
    worst = min(b["padding_efficiency"] for b in manifest["stats"]["stages"][-1]["buckets"])
    result = run_cli("check", tmp_path / "run", "--manifest", "--min-bucket-padding-efficiency", "0.1", "--json", "-")
    assert result.exit_code == 0, result.output + result.stderr
    assert rules_of(result)["padding_efficiency:buckets"]["value"] == worst



def test_a_batch_holding_two_ranks_fails(tmp_path, run_cli):
    src = tmp_path / "mixed"
    src.mkdir()
    pq.write_table(pa.table({"rank": pa.array([0, 0, 1, 1], pa.int32())}), src / "part-00000.parquet")
    result = run_cli("check", src, "--rank-batches")
    assert result.exit_code == 1
    assert "batch 0: ranks [0, 1], expected one" in result.output
