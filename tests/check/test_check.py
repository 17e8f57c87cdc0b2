"""`check` as a library: every rule passing and failing on crafted data with the right measured value,
hashing and duplicate finding in bounded memory, rules files, one pass over only the needed columns."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.check import CheckOptions, check, load_rules, scan
from batchtool.check.hashing import row_hashes
from batchtool.exec.distinct import canonical
from batchtool.check.report import ERROR, FAIL, PASS
from batchtool.check.rules import KINDS, WORDS
from batchtool.check.rules import (BatchRows, Checksums, ClassProportions, Crc, DriftNulls, DriftProportions,
                                   LabelRange, Length, ManifestRows, MinClassRows, NoDuplicateRows, NoNan, NoNulls,
                                   PaddingEfficiency, RankBatches, RowCount, RuleSet, SameLength, Schema, Unique)
from batchtool.exec.convert import convert
from batchtool.io.dataset import Dataset
from batchtool.core.errors import InputError, SchemaError, UsageError
from batchtool.io.inputs import open_dataset
from batchtool.core.run_settings import RunSettings
from batchtool.ops.base import OptionError
from batchtool.core.options import TableError, Typed, fields, read_table
from batchtool.io.output import OutputOptions
from batchtool.io.stats import collect
from batchtool.core.runner import Threads
from conftest import write_parquet_shards

QUIET = RunSettings(threads=2, quiet=True)


def src_of(tmp_path, columns: dict, shards: int = 2, row_group_size: int = 3) -> str:
    """A small Parquet dataset in several shards and row groups, so offenders span chunks."""
    return write_parquet_shards(str(tmp_path / "src"), pa.table(columns), shards, row_group_size)


def run(src: str, *rules, memory: int | None = None, tmp_dir: str | None = None, **options):
    return check(src, RuleSet(tuple(rules)), CheckOptions(**options), replace(QUIET, memory=memory, tmp_dir=tmp_dir))


def one(src: str, rule, **options):
    result = run(src, rule, **options)
    assert len(result.rules) == 1
    return result.rules[0]


def rows_of(result) -> list[tuple[str, int]]:
    return [(os.path.basename(o.file), o.row) for o in result.offenders]


def tokens(lengths: list[int]) -> pa.Array:
    return pa.array([list(range(n)) for n in lengths], pa.list_(pa.int64()))


# ------------------------------------------------------------------------------------------- each rule

def test_schema_passes_and_fails_by_column_and_type(tmp_path):
    src = src_of(tmp_path, {"key": ["a", "b"], "label": [0, 1], "tokens": tokens([1, 2])}, shards=1)
    ok = one(src, Schema("s", (("key", "string"), ("label", "int64"), ("tokens", "list<item: int64>"))))
    assert ok.status == PASS and ok.value == 0 and ok.measured == "all 3 columns as expected"
    bad = one(src, Schema("s", (("key", "string"), ("label", "int32"), ("weight", "float32"))))
    assert bad.status == FAIL and bad.value == 2
    assert [o.detail for o in bad.offenders] == ["column 'label' is int64, expected int32", "column 'weight' missing"]
    exact = one(src, Schema("s", (("key", "string"), ("label", "int64")), exact=True))
    assert exact.status == FAIL and exact.value == 1 and exact.offenders[0].detail == "unexpected column 'tokens'"


def test_no_nulls_counts_nulls_and_lists_the_rows(tmp_path):
    src = src_of(tmp_path, {"key": ["a", None, "c", "d", "e", "f"], "label": [0, 1, None, 1, None, 0]})
    assert one(src, NoNulls("n", ("key",)), key=None).value == 1
    result = one(src, NoNulls("n", ("key", "label")), key=None)
    assert result.status == FAIL and result.value == 3 and result.offending == 3
    assert result.measured == "3 nulls (key: 1, label: 2)"
    assert rows_of(result) == [("part-00000.parquet", 1), ("part-00000.parquet", 2), ("part-00001.parquet", 1)]
    assert result.offenders[0].detail == "null in 'key'"
    assert one(src_of(tmp_path / "ok", {"key": ["a", "b"]}), NoNulls("n", ("key",))).status == PASS


def test_no_nan_counts_values_inside_nested_lists(tmp_path):
    nan = float("nan")
    frames = pa.array([[[0.0, 1.0]], [[nan, 1.0], [nan, 2.0]], [], [[3.0, 4.0]]],
                      pa.list_(pa.list_(pa.float32(), 2)))
    src = src_of(tmp_path, {"weight": [1.0, 2.0, 3.0, nan], "frames": frames, "label": [0, 1, 2, 3]}, shards=1)
    result = one(src, NoNan("nan", ("weight", "frames")))
    assert result.status == FAIL and result.value == 3 and result.offending == 2
    assert rows_of(result) == [("part-00000.parquet", 1), ("part-00000.parquet", 3)]
    assert [o.detail for o in result.offenders] == ["NaN in 'frames'", "NaN in 'weight'"]
    assert one(src, NoNan("nan", ("weight",))).value == 1
    with pytest.raises(SchemaError, match="'label' is int64, expected a float"):
        one(src, NoNan("nan", ("label",)))


def test_label_range_counts_out_of_range_and_null_labels(tmp_path):
    src = src_of(tmp_path, {"label": [0, 1, 5, 2, -1, None], "key": list("abcdef")})
    result = one(src, LabelRange("r", 3))
    assert result.status == FAIL and result.value == 3
    assert result.measured == "3 rows outside [0, 3) (label -1: 1, label 5: 1, null: 1)"
    assert [(o.key, o.detail) for o in result.offenders] == [("c", "label 5"), ("e", "label -1"), ("f", "label null")]
    assert one(src_of(tmp_path / "ok", {"label": [0, 1, 2]}), LabelRange("r", 3)).value == 0


def test_class_proportions_absolute_and_relative(tmp_path):
    src = src_of(tmp_path, {"label": [0] * 80 + [1] * 20}, row_group_size=7)
    exact = one(src, ClassProportions("p", (0.8, 0.2), tolerance=0.0))
    assert exact.status == PASS and exact.value == 0
    off = one(src, ClassProportions("p", (0.7, 0.3), tolerance=0.05))
    assert off.status == FAIL and off.value == pytest.approx(0.1) and off.offending == 2
    assert off.measured == "max deviation 0.1000 (class 0: 0.8000, target 0.7000)"
    assert one(src, ClassProportions("p", (0.75, 0.25), tolerance=0.25, relative=True)).status == PASS
    rel = one(src, ClassProportions("p", (0.75, 0.25), tolerance=0.1, relative=True))
    assert rel.status == FAIL and rel.value == pytest.approx(0.2)
    unseen = one(src, ClassProportions("p", (1.0,), tolerance=0.1))  # class 1 has target 0
    assert unseen.status == FAIL and unseen.value == pytest.approx(0.2)


@pytest.mark.parametrize("target, same", [
    ('"uniform"', ('"1/4,1/4,1/4,1/4"', "[0.25, 0.25, 0.25, 0.25]")),
    ('"0=1/3,1=1/3,3=1/3"', ('"1/3,1/3,0,1/3"',
                               "{0 = 0.3333333333333333, 1 = 0.3333333333333333, 3 = 0.3333333333333334}")),
])
def test_class_proportions_read_targets_as_stratify_does(tmp_path, target, same):
    """'uniform', fractions and CLASS=PROB pairs, in a rules file, through stratify's parser: class 2 has no labels
    (uniform: its target is 1/4 all the same); the pairs' other classes get 0."""
    src = src_of(tmp_path, {"label": [0] * 40 + [1] * 30 + [3] * 30})
    results = [load_rules(rules_file(tmp_path, f'[[rules]]\nkind = "class_proportions"\ntarget = {t}\n'
                                              'tolerance = 0.06\n')).rules[0] for t in (target, *same)]
    judged = [one(src, rule) for rule in results]
    shares = {"uniform": (0.25, 0.25, 0.25, 0.25)}.get(target.strip('"'), (1 / 3, 1 / 3, 0, 1 / 3))
    worst = max((abs(p - t), k) for k, (p, t) in enumerate(zip((0.4, 0.3, 0, 0.3), shares)))
    first = judged[0]
    assert first.status == FAIL and first.value == round(worst[0], 6)
    assert first.measured.startswith(f"max deviation {worst[0]:.4f} (class {worst[1]}: ")
    assert first.offending == sum(abs(p - t) > 0.06 for p, t in zip((0.4, 0.3, 0, 0.3), shares)) > 0
    assert all(j.measured == first.measured and j.offending == first.offending for j in judged[1:])


def test_a_uniform_target_spans_the_classes_up_to_the_largest_label_without_holding_them(tmp_path):
    src = src_of(tmp_path, {"label": [0, 0, 10 ** 15, 10 ** 15]})
    loose = one(src, ClassProportions("p", "uniform", tolerance=0.6))
    assert loose.status == PASS and loose.offending == 0
    exact = one(src, ClassProportions("p", "uniform", tolerance=0.0), max_offenders=3)
    assert exact.status == FAIL and exact.offending == 10 ** 15 + 1
    assert [o.detail.split(":")[0] for o in exact.offenders] == ["class 0", "class 1", "class 2"]
    assert exact.measured.startswith(f"max deviation 0.5000 (class {10 ** 15}: 0.5000, target 0.0000")
    narrowed = one(src, ClassProportions("p", "uniform", tolerance=0.2, num_classes=4))  # 10**15 is no class
    assert narrowed.status == FAIL and narrowed.offending == 5 and narrowed.value == pytest.approx(0.5)


def test_min_class_rows_with_and_without_num_classes(tmp_path):
    src = src_of(tmp_path, {"label": [0] * 30 + [1] * 12})
    assert one(src, MinClassRows("m", 10)).value == 12
    result = one(src, MinClassRows("m", 10, num_classes=3))
    assert result.status == FAIL and result.value == 0 and result.measured == "smallest class 2: 0 rows"
    assert [o.detail for o in result.offenders] == ["class 2: 0 rows"]
    assert one(src, MinClassRows("m", 13)).offenders[0].detail == "class 1: 12 rows"


def test_min_class_rows_with_a_huge_num_classes_holds_only_the_offenders_it_lists(tmp_path):
    """num_classes from a rules file sizes nothing: 10**12 classes are counted, not listed."""
    src = src_of(tmp_path, {"label": [0] * 30 + [1] * 12 + [3] * 11})
    result = one(src, MinClassRows("m", 12, num_classes=10 ** 12))
    assert result.status == FAIL and result.offending == 10 ** 12 - 2 and result.value == 0
    assert result.measured == "smallest class 2: 0 rows"
    assert [o.detail for o in result.offenders] == ["class 2: 0 rows", "class 3: 11 rows", "class 4: 0 rows",
                                                    "class 5: 0 rows", "class 6: 0 rows"]
    full = one(src, MinClassRows("m", 11, num_classes=4))
    assert full.offending == 1 and [o.detail for o in full.offenders] == ["class 2: 0 rows"]


def test_length_bounds_and_quantiles(tmp_path):
    lengths = [5, 1, 7, 10, 3, 12, 6, 4, 8, 9]
    src = src_of(tmp_path, {"tokens": tokens(lengths), "n": lengths})
    ok = one(src, Length("l", min=1, max=12, p50=(5, 6)))
    assert ok.status == PASS and ok.value == {"min": 1, "max": 12, "p50": 6}
    result = one(src, Length("l", column="tokens", min=2, max=9))
    assert result.status == FAIL and result.offending == 3
    assert result.measured == "tokens: min 1, max 12 (min, max out of bounds)"
    assert [o.detail for o in result.offenders] == ["'tokens' length 1", "'tokens' length 10", "'tokens' length 12"]
    quantile = one(src, Length("l", column="n", p90=(1, 9)))
    assert quantile.status == FAIL and quantile.value == {"p90": 10} and quantile.offending == 0


def test_same_length_finds_disagreeing_rows(tmp_path):
    frames = pa.array([[[0.0]] * n for n in [2, 3, 1, 0]], pa.list_(pa.list_(pa.float32(), 1)))
    src = src_of(tmp_path, {"tokens": tokens([2, 2, 1, 1]), "frames": frames}, shards=1)
    result = one(src, SameLength("s", ("tokens", "frames")))
    assert result.status == FAIL and result.value == 2
    assert [o.detail for o in result.offenders] == ["'tokens' 2 steps, 'frames' 3 steps",
                                                    "'tokens' 1 steps, 'frames' 0 steps"]
    with pytest.raises(SchemaError, match="expected a list"):
        one(src_of(tmp_path / "b", {"tokens": tokens([1]), "n": [1]}), SameLength("s", ("tokens", "n")))


def test_unique_keys_report_the_repeat_and_the_row_it_repeats(tmp_path):
    src = src_of(tmp_path, {"key": ["a", "b", "c", "b", "d", "a", "e", "b"], "part": [1, 1, 1, 2, 1, 1, 1, 1]})
    result = one(src, Unique("u", ("key",)))
    assert result.status == FAIL and result.value == 3
    assert [(os.path.basename(o.file), o.row, o.key) for o in result.offenders] == [
        ("part-00000.parquet", 3, "b"), ("part-00001.parquet", 1, "a"), ("part-00001.parquet", 3, "b")]
    assert result.offenders[0].detail.endswith("part-00000.parquet, row 1")
    composite = one(src, Unique("u", ("key", "part")))
    assert composite.value == 2
    assert one(src, Unique("u", ("part", "key")), max_offenders=1).offenders[0].row == 1


def test_duplicate_rows_compare_whole_rows_nan_equal(tmp_path):
    nan = float("nan")
    src = src_of(tmp_path, {"x": [1.0, nan, 1.0, nan, 2.0, 1.0], "tokens": tokens([1, 2, 1, 2, 1, 3])})
    result = one(src, NoDuplicateRows("d"))
    assert result.status == FAIL and result.value == 2 and rows_of(result) == [("part-00000.parquet", 2),
                                                                               ("part-00001.parquet", 0)]
    assert one(src, NoDuplicateRows("d", ("x",))).value == 3
    assert one(src_of(tmp_path / "ok", {"x": [1.0, -1.0]}), NoDuplicateRows("d")).status == PASS


def test_row_count_bounds(tmp_path):
    src = src_of(tmp_path, {"label": list(range(10))})
    assert one(src, RowCount("r", min=10, max=10)).status == PASS
    result = one(src, RowCount("r", min=11))
    assert result.status == FAIL and result.value == 10 and result.measured == "10 rows"
    assert one(src, RowCount("r", max=9)).status == FAIL


def converted(tmp_path, src: str, to: str = "parquet", name: str = "out") -> str:
    dst = str(tmp_path / name)
    convert(src, dst, OutputOptions(format=to, shard_rows=4), run=QUIET)
    return dst


def set_manifest_stats(dst: str, **stats) -> None:
    path = Path(dst, ".batchtool_manifest.json")
    manifest = json.loads(path.read_text())
    manifest["stats"].update(stats)
    path.write_text(json.dumps(manifest))


def test_padding_efficiency_from_the_manifest(tmp_path):
    src = src_of(tmp_path, {"label": list(range(10))})
    dst = converted(tmp_path, src)
    with pytest.raises(InputError, match="no stats.padding_efficiency"):
        one(dst, PaddingEfficiency("p", 0.9))
    with pytest.raises(InputError, match="has no batchtool manifest"):
        one(src, PaddingEfficiency("p", 0.9))
    set_manifest_stats(dst, padding_efficiency=0.93)
    assert one(dst, PaddingEfficiency("p", 0.9)).status == PASS
    result = one(dst, PaddingEfficiency("p", 0.95))
    assert result.status == FAIL and result.value == 0.93 and result.measured == "0.9300"


def flip_byte(path: str, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x01
    Path(path).write_bytes(bytes(data))


def truncate(path: str, drop: int) -> None:
    Path(path).write_bytes(Path(path).read_bytes()[:-drop])


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing", "extra"])
def test_checksums_catch_a_damaged_output_shard(tmp_path, damage):
    dst = converted(tmp_path, src_of(tmp_path, {"label": list(range(12)), "key": [f"k{i}" for i in range(12)]}))
    assert one(dst, Checksums("c")).status == PASS
    shard = os.path.join(dst, "part-00001.parquet")
    if damage == "truncated":
        truncate(shard, 10)
    elif damage == "flipped":
        flip_byte(shard, 100)
    elif damage == "missing":
        os.remove(shard)
    else:
        Path(dst, "part-00009.parquet").write_bytes(Path(shard).read_bytes())
    result = run(dst, Checksums("c"), LabelRange("labels", 12))
    checksums = result.rules[0]
    assert checksums.status == FAIL and checksums.value == 1
    detail = checksums.offenders[0].detail
    assert detail.startswith({"truncated": "truncated", "flipped": "changed", "missing": "missing",
                              "extra": "not listed"}[damage])
    assert os.path.basename(checksums.offenders[0].file) == ("part-00009.parquet" if damage == "extra"
                                                              else "part-00001.parquet")
    assert result.exit_code == 1
    assert result.rules[1].status in (PASS, FAIL, ERROR)  # evaluated, or not if the shard became unreadable


def test_checksums_need_a_manifest(tmp_path):
    with pytest.raises(InputError, match="not a batchtool output directory"):
        one(src_of(tmp_path, {"label": [1]}), Checksums("c"))


def test_unreadable_shard_without_a_failed_checksum_is_exit_2(tmp_path):
    dst = converted(tmp_path, src_of(tmp_path, {"label": list(range(12))}))
    truncate(os.path.join(dst, "part-00001.parquet"), 10)
    with pytest.raises(InputError, match="part-00001.parquet"):
        one(dst, LabelRange("labels", 12))
    result = run(dst, Checksums("c"), LabelRange("labels", 12))
    assert [r.status for r in result.rules] == [FAIL, ERROR]
    assert "part-00001.parquet" in result.rules[1].measured


def test_crc_counts_corrupt_records(tmp_path):
    tfr = converted(tmp_path, src_of(tmp_path, {"label": list(range(12)), "key": [f"k{i}" for i in range(12)]}),
                    to="tfrecord")
    assert one(tfr, Crc("crc")).status == PASS
    flip_byte(os.path.join(tfr, "part-00000.tfrecord"), 20)  # inside the first record's payload
    result = one(tfr, Crc("crc"))
    assert result.status == FAIL and result.value == 1 and "data CRC mismatch" in result.offenders[0].detail
    with_data = run(tfr, Crc("crc"), LabelRange("labels", 12), RowCount("rows", min=12))
    assert [r.value for r in with_data.rules] == [1, 0, 11]
    with pytest.raises(UsageError, match="CRCs exist only in TFRecord"):
        one(src_of(tmp_path / "pq", {"label": [1]}), Crc("crc"))


def test_tfrecord_rows_are_counted_without_decoding(tmp_path, monkeypatch):
    tfr = converted(tmp_path, src_of(tmp_path, {"label": list(range(12))}), to="tfrecord")
    monkeypatch.setattr(Dataset, "tasks", lambda *a, **k: pytest.fail("decoded records"))
    assert one(tfr, RowCount("rows", min=12)).value == 12


# ------------------------------------------------------------------------------------ the pass and plan

def test_plan_reads_only_the_columns_rules_need():
    schema = pa.schema([("key", pa.string()), ("label", pa.int64()), ("tokens", pa.list_(pa.int64())),
                        ("weight", pa.float32())])
    assert scan.scan_plan([LabelRange("r", 4)], schema, key=None, limit=5, memory=1 << 30).columns == ("label",)
    plan = scan.scan_plan([LabelRange("r", 4), Length("l", column="tokens", p50=(1, 2)), Unique("u", ("key",))],
                          schema, key="key", limit=5, memory=1 << 30)
    assert plan.columns == ("label", "tokens", "key") and plan.pairs == (("label", "tokens"),)
    assert scan.scan_plan([RowCount("r", min=1)], schema, key="key", limit=5, memory=1 << 30).columns == ()


def test_stats_collect_counts_nulls_and_nans_like_check(tmp_path):
    nan = float("nan")
    src = src_of(tmp_path, {"w": [1.0, None, nan, 2.0], "seq": pa.array([[nan, nan], None, [1.0], [nan]]),
                            "label": [0, 1, None, 1]})
    stats = collect(open_dataset(src), label="label", nulls=["w", "seq", "label"], nans=["w", "seq"],
                    executor=Threads(2))
    assert stats.null_counts == {"w": 1, "seq": 1, "label": 1} and stats.nan_counts == {"w": 1, "seq": 3}
    assert stats.label_nulls == 1 and stats.rows == 4


def test_parquet_row_count_reads_no_data(tmp_path, monkeypatch):
    src = src_of(tmp_path, {"label": list(range(10))})
    monkeypatch.setattr(Dataset, "tasks", lambda *a, **k: pytest.fail("read data"))
    assert one(src, RowCount("r", min=1)).value == 10


def test_results_do_not_depend_on_threads(tmp_path):
    rng = np.random.default_rng(3)
    n = 400
    src = src_of(tmp_path, {"key": [f"k{i % 350}" for i in range(n)], "label": rng.integers(-1, 5, n),
                            "tokens": tokens(rng.integers(0, 20, n).tolist())}, shards=3, row_group_size=17)
    rules = (LabelRange("r", 4), Unique("u", ("key",)), Length("l", min=1, max=18), NoDuplicateRows("d"))
    results = [check(src, RuleSet(rules), CheckOptions(), RunSettings(threads=t, quiet=True)) for t in (1, 3)]
    assert results[0].rules == results[1].rules
    assert results[0].rules[1].value == 50


def test_schema_failure_turns_rules_on_missing_columns_into_errors(tmp_path):
    src = src_of(tmp_path, {"key": ["a", "b"]})
    result = run(src, Schema("s", (("label", "int64"),)), LabelRange("r", 2))
    assert [r.status for r in result.rules] == [FAIL, ERROR] and result.exit_code == 1
    assert "no column 'label'" in result.rules[1].measured
    with pytest.raises(SchemaError, match="no column 'label'"):
        run(src, LabelRange("r", 2))


def test_usage_errors(tmp_path):
    src = src_of(tmp_path, {"key": ["a", "b"], "label": [0.5, 1.0]})
    with pytest.raises(UsageError, match="no rules"):
        run(src)
    with pytest.raises(SchemaError, match="expected an integer label column"):
        run(src, LabelRange("r", 2))
    with pytest.raises(SchemaError, match="no list column"):
        run(src, Length("l", min=1))
    with pytest.raises(SchemaError, match="--key: no column 'id'"):
        run(src, NoNulls("n", ("key",)), key="id")
    with pytest.raises(UsageError, match="--max-offenders -1"):
        CheckOptions(max_offenders=-1)
    with pytest.raises(UsageError, match="named 'x'"):
        RuleSet((RowCount("x", min=1), RowCount("x", max=1)))



@pytest.mark.parametrize("rules, key, message", [
    ((LabelRange("r", 2),), None, "rule 'r': column 'label' is double, expected an integer label column"),
    ((Length("l", column="label", min=1),), None,
     "rule 'l': column 'label' is double, expected a list column or an integer length column"),
    ((NoNan("n", ("key",)),), None, "rule 'n': column 'key' is string, expected a float or list-of-float column"),
    ((SameLength("s", ("key", "label")),), None, "rule 's': column 'key' is string, expected a list (sequence) column"),
    ((NoNulls("n", ("key",)),), "id", "--key: no column 'id' (columns: key, label)"),
])
def test_a_column_of_the_wrong_type_is_named_with_what_the_rule_expects(tmp_path, rules, key, message):
    src = src_of(tmp_path, {"key": ["a", "b"], "label": [0.5, 1.0]})
    with pytest.raises(SchemaError) as caught:
        run(src, *rules, key=key)
    assert str(caught.value) == message

# ------------------------------------------------------------------------------------ hashing, repeats

def batch_of(values, type_=None) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(values, type_)})


def test_hashes_separate_values_that_share_their_bytes():
    h = row_hashes(batch_of([["ab", "c"], ["a", "bc"], ["abc"], [], None, ["ab", "c"]]), ["v"])
    assert len(set(h[:5].tolist())) == 5 and h[0] == h[5]
    nested = row_hashes(batch_of([[[1, 2], [3]], [[1], [2, 3]], [[1, 2, 3]]]), ["v"])
    assert len(set(nested.tolist())) == 3
    two = pa.record_batch({"a": ["ab", "a"], "b": ["c", "bc"]})
    assert row_hashes(two, ["a", "b"])[0] != row_hashes(two, ["a", "b"])[1]


def test_hashes_ignore_slicing_and_equal_nans():
    arr = pa.array([[1.0, float("nan")], [2.0], None, [3.0, -0.0]], pa.list_(pa.float32()))
    whole = row_hashes(pa.record_batch({"v": arr}), ["v"])
    part = row_hashes(pa.record_batch({"v": arr.slice(1)}), ["v"])
    assert part.tolist() == whole[1:].tolist()
    other_nan = pa.array([[1.0, -float("nan")]], pa.list_(pa.float32()))
    assert row_hashes(pa.record_batch({"v": other_nan}), ["v"])[0] == whole[0]
    assert canonical([1.0, float("nan")]) == canonical([1.0, -float("nan")])


values_st = st.lists(st.one_of(st.none(), st.lists(st.sampled_from(["", "a", "ab", "b"]), max_size=3)),
                     min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(values_st, st.lists(st.integers(0, 2), min_size=30, max_size=30))
def test_equal_hashes_iff_equal_rows(words, numbers):
    batch = pa.record_batch({"w": pa.array(words, pa.list_(pa.string())),
                             "n": pa.array(numbers[:len(words)], pa.int8())})
    hashes = row_hashes(batch, ["w", "n"]).tolist()
    rows = list(zip(words, numbers))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (hashes[i] == hashes[j]) == (rows[i] == rows[j])


def test_duplicates_spill_end_to_end(tmp_path):
    n = 3000
    keys = [f"k{i}" for i in range(n)]
    keys[2500], keys[2999] = keys[7], keys[1234]
    src = src_of(tmp_path, {"key": keys}, shards=3, row_group_size=250)
    result = one(src, Unique("u", ("key",)), memory=1, tmp_dir=str(tmp_path / "tmp"))
    assert result.value == 2 and [o.key for o in result.offenders] == ["k7", "k1234"]
    assert os.listdir(tmp_path / "tmp") == []


def test_hash_collisions_are_confirmed_away(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "row_hashes", lambda batch, cols: np.zeros(batch.num_rows, np.uint64))
    src = src_of(tmp_path, {"key": [f"k{i}" for i in range(20)]})
    result = one(src, Unique("u", ("key",)), max_offenders=2)
    assert result.status == PASS and result.value == 0
    dup = src_of(tmp_path / "dup", {"key": ["a"] + [f"k{i}" for i in range(10)] + ["a", "a"]})
    result = one(dup, Unique("u", ("key",)), max_offenders=1)
    assert result.status == FAIL and result.value == 2 and result.offenders[0].key == "a"


# ----------------------------------------------------------------------------------------- rules files

def rules_file(tmp_path, text: str) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return str(path)


def test_rules_file_builds_every_kind(tmp_path):
    path = rules_file(tmp_path, """
key = "id"
max_offenders = 2
[[rules]]
kind = "schema"
columns = { id = "string" }
[[rules]]
name = "lengths"
kind = "length"
p50 = [1, 2]
max = 3
[[rules]]
kind = "class_proportions"
target = [0.5, 0.5]
tolerance = 1
relative = true
""")
    rules = load_rules(path)
    assert rules.key == "id" and rules.max_offenders == 2
    assert rules.rules == (Schema("schema", (("id", "string"),)), Length("lengths", max=3, p50=(1, 2)),
                           ClassProportions("class_proportions", (0.5, 0.5), 1.0, True))


def test_rules_file_builds_the_output_batch_and_drift_kinds(tmp_path):
    path = rules_file(tmp_path, """
baseline = "old/"
[[rules]]
kind = "manifest_rows"
[[rules]]
kind = "padding_efficiency"
min = 0.5
per_bucket = true
[[rules]]
kind = "batch_rows"
max = 32
[[rules]]
kind = "rank_batches"
column = "worker"
[[rules]]
kind = "drift_proportions"
column = "y"
tolerance = 0.05
[[rules]]
kind = "drift_nulls"
columns = ["a"]
""")
    rules = load_rules(path)
    assert rules.baseline == "old/"
    assert rules.rules == (ManifestRows("manifest_rows"), PaddingEfficiency("padding_efficiency", 0.5, True),
                           BatchRows("batch_rows", max=32), RankBatches("rank_batches", "worker"),
                           DriftProportions("drift_proportions", 0.05, "y"), DriftNulls("drift_nulls", 0.01, ("a",)))
    assert [r.tolerance for r in rules.drift] == [0.05, 0.01]


@pytest.mark.parametrize("text, message", [
    ('[[rules]]\nkind = "batch_rows"', "rule 'batch_rows' (batch_rows), key 'min': a batch_rows rule needs min or max"),
    ('[[rules]]\nkind = "drift_rows"\ntolerance = -0.1', "key 'tolerance': must be a number >= 0, got -0.1"),
    ('[[rules]]\nkind = "padding_efficiency"\nmin = 0.5\nper_bucket = 1', "key 'per_bucket': must be a boolean"),
    ('[[rules]]\nkind = "unique"\ncolumns = ["k"]\nmin = 1', "rule 'unique' (unique), key 'min': unknown key"),
    ('[[rules]]\nname = "n"\nkind = "row_count"\nmin = "5"',
     "rule 'n' (row_count), key 'min': must be an integer, got string '5'"),
    ('[[rules]]\nkind = "label_range"\nnum_classes = 0', "key 'num_classes': must be at least 1, got 0"),
    ('[[rules]]\nkind = "label_range"', "key 'num_classes': required"),
    ('[[rules]]\nkind = "length"\np50 = [1]', "key 'p50': must be a list of 2 integers"),
    ('[[rules]]\nkind = "no_nulls"\ncolumns = "key"', "key 'columns': must be a list of strings"),
    ('[[rules]]\nkind = "bogus"', "rule 'bogus': key 'kind' must be one of schema, no_nulls"),
    ('[[rules]]\nkind = "crc"\n[[rules]]\nkind = "crc"', "two rules are named 'crc'"),
    ('thresholds = 1\n[[rules]]\nkind = "crc"', "unknown top-level key 'thresholds'"),
    ('[[rules]\nkind = "crc"', "not valid TOML"),
    ('key = "k"', "no rules"),
])
def test_rules_file_errors_name_the_file_the_rule_and_the_key(tmp_path, text, message):
    path = rules_file(tmp_path, text)
    with pytest.raises(UsageError) as err:
        load_rules(path)
    assert str(err.value).startswith(path) and message in str(err.value)
    assert "\n" not in str(err.value)


def test_sample_rules_pass_on_sample_data():
    from conftest import SAMPLE
    result = check(os.path.join(SAMPLE, "parquet"), load_rules(os.path.join(SAMPLE, "rules.toml")),
                   CheckOptions(), QUIET)
    assert result.passed, [r for r in result.rules if r.status != PASS]
    assert result.rows == 4000 and len(result.rules) == 11
    assert not math.isnan(result.seconds)


def test_every_rule_key_is_declared_in_its_option_schema():
    for cls in (*KINDS.values(), RuleSet):
        declared = [f.name for f, _ in fields(cls)]
        assert declared == [f.name for f in dataclasses.fields(cls) if f.name not in ("rules", "origin")], cls


def test_rules_and_pipelines_share_one_table_reader():
    def keep(name):
        return name

    assert read_table(RowCount, {"name": "r", "min": 1}, name=keep) == RowCount("r", min=1)
    with pytest.raises(TableError) as unknown:
        read_table(RowCount, {"name": "r", "mni": 1}, name=keep)
    assert unknown.value.unknown and unknown.value.allowed == ("name", "min", "max")
    assert str(unknown.value) == "unknown key 'mni' (did you mean 'min'?)"
    with pytest.raises(TableError) as missing:
        read_table(LabelRange, {"name": "r"}, name=keep)
    assert missing.value.missing and missing.value.key == "num_classes"
    with pytest.raises(OptionError) as bad:
        read_table(LabelRange, {"name": "r", "num_classes": 2.5}, name=keep)
    assert (bad.value.field, bad.value.problem) == ("num_classes", "must be an integer, got float 2.5")


def test_typed_values_say_wrong_types_in_the_words_given():
    with pytest.raises(OptionError, match="expected a list of 2 integers, got list"):
        Typed(int, count=2).parse("p50", [1])
    with pytest.raises(OptionError, match=r"must be a list of numbers, got array \[True\]"):
        Typed(float, array=True, wording=WORDS).parse("target", [True])
    assert Typed(float, array=True).parse("target", (1, 0.5)) == (1.0, 0.5)


@pytest.mark.parametrize("text, message", [
    ('key = 1\n[[rules]]\nkind = "crc"', ": top-level key 'key' must be a string, got integer 1"),
    ('max_offenders = -1\n[[rules]]\nkind = "crc"', ": top-level key 'max_offenders' must be >= 0, got -1"),
    ('rules = 3', ": top-level key 'rules' must be an array, got integer 3"),
    ('thresholds = 1\n[[rules]]\nkind = "crc"',
     ": unknown top-level key 'thresholds' (expected: rules, key, max_offenders, baseline)"),
    ('[[rules]]\nkind = "row_count"\nmin = 1.5', ": rule 'row_count' (row_count), key 'min': must be an integer, got "
                                                  "float 1.5"),
    ('[[rules]]\nkind = "schema"\ncolumns = ["a"]',
     ": rule 'schema' (schema), key 'columns': must be a table of column = \"type\", got array ['a']"),
    ('[[rules]]\nkind = "unique"\ncolumns = ["k"]\nmin = 1',
     ": rule 'unique' (unique), key 'min': unknown key (expected: kind, name, columns)"),
])
def test_rules_file_top_level_and_type_errors_are_worded_as_before(tmp_path, text, message):
    path = rules_file(tmp_path, text)
    with pytest.raises(UsageError) as err:
        load_rules(path)
    assert str(err.value) == path + message
