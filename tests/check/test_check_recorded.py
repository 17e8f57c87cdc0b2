"""Every value `check` reads from a manifest's stats (a --baseline's, or SRC's own for the batch and padding rules) is
validated where it is read: a malformed one is one `error:` line naming the manifest file and the key path, exit 2,
never a traceback, and never a negative count taken for a share."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest

from batchtool.io.manifest import MANIFEST_NAME
from batchtool.core.synthetic import make_table
from conftest import write_parquet_shards
from dirstate import snapshot


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """A stratified output (a manifest with class counts), a bucketed one, a balanced one, a two-rank segment one and
    a pipeline's, made once."""
    from click.testing import CliRunner

    from batchtool.cli import cli

    root = tmp_path_factory.mktemp("recorded")
    table = make_table(200, seed=7)
    table = table.set_column(1, "label", pa.array(np.arange(200) % 4, pa.int64()))
    src = write_parquet_shards(str(root / "src"), table)
    runs = {
        "stratified": ["stratify", "--target", "0.4,0.3,0.2,0.1"],
        "bucketed": ["bucket", "--boundaries", "40,80", "--batch-size", "8"],
        "balanced": ["stratify", "--target", "uniform", "--balanced-batches", "--batch-size", "8"],
        "ranks": ["segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "50", "--batch-size", "4",
                  "--world-size", "2", "--shard-rows", "8"],
    }
    out = {"src": src}
    for name, args in runs.items():
        out[name] = str(root / name)
        result = CliRunner().invoke(cli, [args[0], src, out[name], *args[1:], "-q"])
        assert result.exit_code == 0, result.output
    pipeline = root / "pipeline.toml"
    out["run"] = str(root / "run")
    pipeline.write_text(f'[input]\npath = "{src}"\n[[stage]]\nop = "shuffle"\n[[stage]]\nop = "stratify"\n'
                        f'target = "uniform"\n[output]\npath = "{out["run"]}"\n')
    assert CliRunner().invoke(cli, ["run", str(pipeline), "-q"]).exit_code == 0
    return out


def damaged(outputs: dict[str, str], tmp_path, name: str, change) -> str:
    """A copy of output `name` whose manifest `change(manifest)` altered."""
    copy = str(tmp_path / f"{name}-damaged")
    shutil.copytree(outputs[name], copy)
    path = os.path.join(copy, MANIFEST_NAME)
    manifest = json.loads(open(path).read())
    change(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)
    return copy


def set_in(*keys_and_value):
    *keys, value = keys_and_value

    def change(manifest: dict) -> None:
        node = manifest
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


BASELINES = {
    "a class count 'x'": (set_in("stats", "class_counts_after", "3", "x"),
                          "stats.class_counts_after.3 is 'x', expected a non-negative integer"),
    "a class count of -100": (set_in("stats", "class_counts_after", "3", -100),
                              "stats.class_counts_after.3 is -100, expected a non-negative integer"),
    "a class count of true": (set_in("stats", "class_counts_after", "0", True),
                              "stats.class_counts_after.0 is True, expected a non-negative integer"),
    "a class that is no number": (set_in("stats", "class_counts_after", {"three": 4}),
                                  "stats.class_counts_after.three is 'three', expected a class: a non-negative "
                                  "integer key"),
    "class counts as a list": (set_in("stats", "class_counts_after", [1, 2]),
                               "stats.class_counts_after is [1, 2], expected an object of class counts"),
    "a label column that is a number": (set_in("stats", "label", 7), "stats.label is 7, expected a non-empty string"),
}


@pytest.mark.parametrize("case", list(BASELINES))
@pytest.mark.parametrize("given", ["manifest", "directory"])
def test_a_malformed_baseline_value_is_one_line_naming_the_file_and_key(outputs, tmp_path, run_cli, case, given):
    change, message = BASELINES[case]
    base = damaged(outputs, tmp_path, "stratified", change)
    spec = os.path.join(base, MANIFEST_NAME) if given == "manifest" else base
    before = snapshot(tmp_path)
    result = run_cli("check", outputs["stratified"], "--baseline", spec)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {os.path.join(base, MANIFEST_NAME)}: {message}\n"
    assert snapshot(tmp_path) == before


def test_a_pipeline_baseline_names_its_last_stage(outputs, tmp_path, run_cli):
    def change(manifest: dict) -> None:
        manifest["stats"]["stages"][-1]["class_counts_after"]["1"] = -5
    base = damaged(outputs, tmp_path, "run", change)
    result = run_cli("check", outputs["run"], "--baseline", base)
    assert result.stderr == (f"error: {os.path.join(base, MANIFEST_NAME)}: stats.stages[1].class_counts_after.1 is -5, "
                             "expected a non-negative integer\n") and result.exit_code == 2


def test_a_well_formed_baseline_manifest_still_compares(outputs, run_cli):
    result = run_cli("check", outputs["stratified"], "--baseline", os.path.join(outputs["stratified"], MANIFEST_NAME))
    assert result.exit_code == 0 and "4 rules: 4 passed" in result.output


OWN = {
    "padding efficiency -0.5": ("bucketed", set_in("stats", "padding_efficiency", -0.5),
                                ["--min-padding-efficiency", "0.5"],
                                "stats.padding_efficiency is -0.5, expected a number in [0, 1]"),
    "padding efficiency 'x'": ("bucketed", set_in("stats", "padding_efficiency", "x"),
                               ["--min-padding-efficiency", "0.5"],
                               "stats.padding_efficiency is 'x', expected a number in [0, 1]"),
    "a bucket's efficiency 2": ("bucketed", lambda m: m["stats"]["buckets"][1].update(padding_efficiency=2),
                                ["--min-bucket-padding-efficiency", "0.5"],
                                "stats.buckets[1].padding_efficiency is 2, expected a number in [0, 1]"),
    "a bucket's lengths 'x'": ("bucketed", lambda m: m["stats"]["buckets"][0].update(lengths="x"),
                               ["--min-bucket-padding-efficiency", "0.5"],
                               "stats.buckets[0].lengths is 'x', expected [low, high] (high null when unbounded)"),
    "buckets not a list": ("bucketed", set_in("stats", "buckets", {"0": 1}), ["--min-bucket-padding-efficiency", "0.5"],
                           "stats.buckets is {'0': 1}, expected a list"),
    "a target share 'x'": ("balanced", set_in("stats", "target", ["x", 0.5, 0.25, 0.25]), ["--batch-quotas"],
                           "stats.target[0] is 'x', expected a number in [0, 1]"),
    "a batch size of -8": ("balanced", set_in("stats", "batch_size", -8), ["--batch-quotas"],
                           "stats.batch_size is -8, expected a non-negative integer"),
    "a final quota of 1.5": ("balanced", set_in("stats", "final_batch_quotas", [1.5, 0, 0, 0]), ["--batch-quotas"],
                             "stats.final_batch_quotas[0] is 1.5, expected a non-negative integer"),
    "a rank of -1": ("ranks", lambda m: m["output"]["files"][0].update(rank=-1), ["--rank-batches"],
                     "output.files[0].rank is -1, expected a non-negative integer"),
}


@pytest.mark.parametrize("case", list(OWN))
def test_a_malformed_value_of_src_s_own_manifest_is_one_line(outputs, tmp_path, run_cli, case):
    name, change, args, message = OWN[case]
    src = damaged(outputs, tmp_path, name, change)
    result = run_cli("check", src, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {os.path.join(src, MANIFEST_NAME)}: {message}\n"


def test_the_batch_rules_pass_on_the_well_formed_outputs(outputs, run_cli):
    for name, args in (("bucketed", ["--min-bucket-padding-efficiency", "0.1", "--min-padding-efficiency", "0.1"]),
                       ("balanced", ["--batch-quotas"]), ("ranks", ["--rank-batches"])):
        result = run_cli("check", outputs[name], *args)
        assert result.exit_code == 0, (name, result.output, result.stderr)
