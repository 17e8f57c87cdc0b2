"""stratify: exact counts, uniform selection, stratified_sample's acceptance formula, online estimate, balanced batches."""

from __future__ import annotations

import math
import os
from collections import Counter
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.exec.driver import run_operation, scanner
from batchtool.core.errors import InputError, SchemaError, UsageError
from batchtool.io.inputs import open_dataset
from batchtool.core.run_settings import RunSettings
from batchtool.ops.base import Context
from batchtool.ops.labels import MAX_CLASSES
from batchtool.ops.quotas import plan_layout
from batchtool.ops.stratify import OP, ONLINE_PRIOR, StratifyOptions
from batchtool.ops.stratify.plans import (STAGE, acceptance_probs, exact_target, exact_totals, largest_total,
                                          threshold_plan)
from batchtool.ops.stratify.thresholds import find_thresholds
from batchtool.ops.targets import parse_target
from batchtool.io.output import OutputOptions
from batchtool.pipeline import load, run_pipeline
from batchtool.core.synthetic import make_table
from batchtool.core.runner import SERIAL, Threads
from conftest import read_dir, write_parquet_shards

QUIET = RunSettings(threads=2, quiet=True)


def run(src, dst, threads: int = 2, seed: int = 0, memory: int | None = None, tmp_dir: str | None = None,
        **options):
    return run_operation(OP, StratifyOptions(**options), src, str(dst), OutputOptions(),
                         RunSettings(threads=threads, quiet=True, memory=memory, tmp_dir=tmp_dir), seed=seed)


def labelled(path, labels, row_group_size: int = 50, **columns) -> str:
    """A Parquet dataset with a unique key per row, the given labels and any extra columns."""
    n = len(labels)
    table = pa.table({"key": [f"k{i:06d}" for i in range(n)], "label": pa.array(labels), **columns})
    return write_parquet_shards(str(path), table, shards=2, row_group_size=row_group_size)


@pytest.fixture(scope="module")
def big_src(tmp_path_factory) -> str:
    """20,000 rows with the synthetic 90/7/2/1 label mix (small columns only, so it is quick)."""
    table = make_table(20_000, seed=3, median_length=2, max_length=4).select(["key", "label", "weight"])
    return write_parquet_shards(str(tmp_path_factory.mktemp("big") / "src"), table, shards=3, row_group_size=700)


def test_parse_target_forms_and_errors():
    assert parse_target("uniform") == "uniform"
    assert parse_target("0.5, 0.25,0.25") == (0.5, 0.25, 0.25)
    assert parse_target("0=0.5,3=0.5") == {0: 0.5, 3: 0.5}
    for bad in ("0.5,x", "a=0.5", "1=0.5,1=0.5", "-1=1"):
        with pytest.raises(UsageError, match="--target"):
            parse_target(bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"target": (0.5, 0.6)}, r"sum to 1\.1, expected 1 \(tolerance 1e-06\)"),
    ({"target": (1.5, -0.5)}, r"must be >= 0 \(value 1 is -0.5\)"),
    ({"target": (0.5, 0.5), "mode": "bernoulli", "init_probs": (0.2, 0.2)}, "--init-probs 0.2,0.2: probabilities sum"),
    ({"target": (0.5, 0.5), "num_classes": 3}, "--target gives 2, --num-classes gives 3"),
    ({"target": {5: 1.0}, "num_classes": 3}, "names class 5 but there are only 3 classes"),
    ({"target": "uniform", "init_probs": (1.0,)}, "--init-probs applies to --mode bernoulli"),
    ({"target": "uniform", "mode": "online", "replacement": True}, "--replacement needs the class counts"),
    ({"target": "uniform", "mode": "bernoulli", "size": 10}, "--size 10"),
    ({"target": "uniform", "balanced_batches": True}, "--balanced-batches needs --batch-size"),
    ({"target": "uniform", "mode": "magic"}, "--mode 'magic'"),
])
def test_option_errors_name_the_flag(kwargs, message):
    with pytest.raises(UsageError, match=message):
        StratifyOptions(**kwargs)


def test_probabilities_within_the_tolerance_are_accepted():
    StratifyOptions(target=(0.5, 0.5 + 0.9e-6))
    with pytest.raises(UsageError):
        StratifyOptions(target=(0.5, 0.5 + 1.1e-6))


def test_acceptance_formula_on_a_hand_worked_example():
    """p = 90/7/2/1 %, uniform target: t/p = 0.278, 3.571, 12.5, 25, so a = t/p / 25."""
    a = acceptance_probs(np.array([0.9, 0.07, 0.02, 0.01]), np.full(4, 0.25))
    assert a == pytest.approx([1 / 90, 1 / 7, 0.5, 1.0])
    assert np.array([0.9, 0.07, 0.02, 0.01]) * a == pytest.approx(np.full(4, 0.01))  # equal expected counts
    assert acceptance_probs(np.array([0.5, 0.5, 0.0]), np.array([0.2, 0.8, 0.0])) == pytest.approx([0.25, 1, 0])


def test_largest_total_on_hand_examples():
    assert largest_total(np.array([90, 7, 2, 1]), exact_target("uniform", 4)) == 4  # the class of 1 limits M
    assert largest_total(np.array([10, 10]), exact_target((0.7, 0.3), 2)) == Fraction(100, 7)
    assert largest_total(np.array([5, 0]), exact_target((1.0, 0.0), 2)) == 5
    assert largest_total(np.array([2709, 199, 62, 30]), exact_target((0.4, 0.3, 0.2, 0.1), 4)) == 300


@given(st.lists(st.integers(0, 500), min_size=1, max_size=6), st.data())
@settings(max_examples=80, deadline=None)
def test_exact_totals_fit_the_counts_and_are_exact_when_they_can_be(counts, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, 100), min_size=len(counts) - 1, max_size=len(counts) - 1)))
    weights = np.diff([0, *cuts, 100])
    counts = np.array(counts)
    if any(w > 0 and n == 0 for w, n in zip(weights, counts)):
        return
    target = tuple(w / 100 for w in weights)  # decimals as a user writes them (0.3 is not exact in binary)
    totals, m = exact_totals(counts, np.array(target) / sum(target), StratifyOptions(label="label", target=target))
    assert np.all(totals <= counts)  # no class gives more than it has...
    assert any(k == n for k, n, w in zip(totals, counts, weights) if w > 0)  # ...and the scarcest gives all
    scale = data.draw(st.integers(1, 20))  # counts proportional to the weights: the output is exactly that
    proportional = weights * scale
    exact, _ = exact_totals(proportional, np.array(target) / sum(target), StratifyOptions(label="label", target=target))
    assert exact.tolist() == proportional.tolist()


def test_batch_layout_rotates_tied_remainders_and_fills_a_final_batch():
    layout = plan_layout(np.array([100, 100, 100, 100]), np.full(4, 0.25), 10, partial=True, oversample=False)
    quotas = list(layout.sequence())
    assert all(q.sum() == 10 and set(q) == {2, 3} for q in quotas[:layout.batches])
    assert layout.batches == 40 and layout.per_class.tolist() == [100, 100, 100, 100]
    short = plan_layout(np.array([10, 3]), np.array([0.5, 0.5]), 4, partial=True, oversample=False)
    assert short.batches == 1 and short.partial == (2, 1)  # leftover 8 and 1: a batch of 3 as 2 + 1
    assert plan_layout(np.array([10, 3]), np.array([0.5, 0.5]), 4, partial=False, oversample=False).partial == ()


def test_exact_counts_no_duplicates_and_rows_equal_input_rows(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target=(0.4, 0.3, 0.2, 0.1))
    out = read_dir(str(tmp_path / "out"))
    counts = np.bincount(pq.read_table(big_src).column("label").to_numpy(), minlength=4)
    m = largest_total(counts, exact_target((0.4, 0.3, 0.2, 0.1), 4))
    expected = [math.floor(m * t) for t in exact_target((0.4, 0.3, 0.2, 0.1), 4)]
    assert np.bincount(out.column("label").to_numpy(), minlength=4).tolist() == expected
    keys = out.column("key").to_pylist()
    assert len(set(keys)) == len(keys)
    source = {r["key"]: r for r in pq.read_table(big_src).to_pylist()}
    assert all(source[r["key"]] == r for r in out.to_pylist())
    stats = result.manifest["stats"]
    assert stats["total_m"] == (int(m) if m.denominator == 1 else round(float(m), 6)) and stats["class_counts_before"] == {str(i): int(n) for i, n in enumerate(counts)}
    assert stats["examples_dropped"] == 20_000 - out.num_rows and stats["examples_duplicated"] == 0


@pytest.mark.parametrize("mode, label_passes", [("exact", 2), ("bernoulli", 1)])
def test_label_passes_decode_the_label_column_only(tmp_path, monkeypatch, mode, label_passes):
    """The passes before the selection (class counts; exact mode's thresholds) decode the label column alone, and
    the selection decodes each row group once: every column of the rows it keeps costs one decode, not a pass."""
    from batchtool.io.formats import parquet

    src = labelled(tmp_path / "src", [0] * 90 + [1] * 10, row_group_size=25,
                   tokens=pa.array([[i] * 3 for i in range(100)], pa.list_(pa.int32())))
    decoded: list[tuple[str, ...] | None] = []
    real = parquet.decode_row_group

    def counted(pf, row_group, columns):
        decoded.append(None if columns is None else tuple(columns))
        return real(pf, row_group, columns)

    monkeypatch.setattr(parquet, "decode_row_group", counted)
    run(src, tmp_path / "out", threads=1, target="uniform", mode=mode)
    row_groups = sum(pq.ParquetFile(os.path.join(src, f)).num_row_groups for f in os.listdir(src)
                     if f.endswith(".parquet"))
    assert Counter(decoded) == {("label",): label_passes * row_groups, None: row_groups}


def test_exact_selection_takes_the_smallest_keyed_hashes_in_input_order(tmp_path):
    labels = [0, 1] * 30
    src = labelled(tmp_path / "src", labels, row_group_size=7)
    run(src, tmp_path / "out", target="uniform", size=20, seed=5)
    ids = np.concatenate([rng.example_ids(0, 0, 30), rng.example_ids(1, 0, 30)])
    hashes = rng.keyed_hash(5, STAGE, ids)
    expected = []
    for cls in (0, 1):
        members = np.flatnonzero(np.array(labels) == cls)
        expected += members[np.argsort(hashes[members])[:10]].tolist()
    assert read_dir(str(tmp_path / "out")).column("key").to_pylist() == [f"k{i:06d}" for i in sorted(expected)]


def test_thresholds_found_in_several_passes_are_exact(tmp_path):
    labels = np.random.default_rng(0).integers(0, 3, 3000)
    dataset = open_dataset(labelled(tmp_path / "src", labels.tolist(), row_group_size=128))
    ids = np.concatenate([rng.example_ids(0, 0, 1500), rng.example_ids(1, 0, 1500)])
    hashes = rng.keyed_hash(9, STAGE, ids)
    counts = np.bincount(labels)
    ranks = {0: 1, 1: int(counts[1]) // 2, 2: int(counts[2])}
    for budget in (1, 100, 1 << 22):  # 1: histogram passes down to 48 fixed bits; huge: one collecting pass
        found = find_thresholds(scanner(dataset, Threads(2)), "label", 3, ranks, counts, seed=9, locate=dataset.locate,
                                budget=budget)
        assert found == {c: int(np.sort(hashes[labels == c])[k - 1]) for c, k in ranks.items()}


def test_within_class_selection_is_uniform_over_subsets(tmp_path):
    """6 examples of class 0, keep 3: each of the 20 subsets about equally often over 600 seeds (chi-square)."""
    labels = [0] * 6 + [1] * 3
    dataset = open_dataset(labelled(tmp_path / "src", labels))
    ids = np.concatenate([rng.example_ids(0, 0, 5), rng.example_ids(1, 0, 4)])  # 2 shards of 5 and 4 rows
    codes = np.array(labels)
    counts = np.array([6, 3])
    subsets = Counter()
    for seed in range(600):
        plan = threshold_plan(np.array([3, 3]), counts, lambda ranks, seed=seed: find_thresholds(
            scanner(dataset, SERIAL), "label", 2, ranks, counts, seed, dataset.locate))
        copies = plan.copies(codes, ids, seed)
        assert copies[6:].tolist() == [1, 1, 1] and copies[:6].sum() == 3
        subsets[tuple(np.flatnonzero(copies[:6]))] += 1
    assert len(subsets) == 20
    expected = 600 / 20
    chi2 = sum((n - expected) ** 2 / expected for n in subsets.values())
    assert chi2 < 43.8  # 19 degrees of freedom, p = 0.001


def test_bernoulli_counts_within_binomial_error(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target="uniform", mode="bernoulli")
    stats = result.manifest["stats"]
    before = np.array([stats["class_counts_before"][str(i)] for i in range(4)])
    after = np.array([stats["class_counts_after"][str(i)] for i in range(4)])
    a = acceptance_probs(before / before.sum(), np.full(4, 0.25))
    assert stats["acceptance_probs"] == pytest.approx(a.tolist())
    mean, sd = before * a, np.sqrt(before * a * (1 - a))
    assert np.all(np.abs(after - mean) <= 4 * sd + 1e-9), (after, mean, sd)


def test_bernoulli_with_init_probs_needs_no_counting_pass(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target=(0.5, 0.5, 0, 0), mode="bernoulli", init_probs=(0.5, 0.5, 0, 0))
    after = result.manifest["stats"]["class_counts_after"]
    assert after["2"] == after["3"] == 0
    n1 = result.manifest["stats"]["class_counts_before"]["1"]
    assert after["1"] == n1  # a_1 = 1


def test_online_follows_the_documented_running_estimate(tmp_path, big_src):
    """Chunk c uses a = acceptance(counts of chunks 0..c + prior, target); counts within binomial error."""
    target = np.array([0.25, 0.25, 0.25, 0.25])
    result = run(big_src, tmp_path / "out", target="uniform", mode="online", num_classes=4)
    seen = np.full(4, float(ONLINE_PRIOR))
    mean, var = np.zeros(4), np.zeros(4)
    for chunk in open_dataset(big_src).chunks(["label"]):
        n = np.bincount(chunk.data.column("label").to_numpy(), minlength=4)
        seen += n
        a = acceptance_probs(seen / seen.sum(), target)
        mean += n * a
        var += n * a * (1 - a)
    after = np.array([result.manifest["stats"]["class_counts_after"][str(i)] for i in range(4)])
    assert np.all(np.abs(after - mean) <= 4 * np.sqrt(var) + 1e-9), (after, mean)
    assert after / after.sum() == pytest.approx(target, abs=0.06)
    assert result.manifest["stats"]["online_final_probs"] == pytest.approx((seen / seen.sum()).tolist())


def test_replacement_exact_totals_with_consecutive_copies(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target="uniform", replacement=True, size=8000)
    out = read_dir(str(tmp_path / "out")).select(["key", "label"])
    labels = out.column("label").to_numpy()
    assert np.bincount(labels, minlength=4).tolist() == [2000] * 4
    keys = np.array(out.column("key").to_pylist())
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    assert len(np.unique(keys)) == len(starts)  # each example's copies are one consecutive run
    lengths = np.diff(np.r_[starts, len(keys)])
    before = result.manifest["stats"]["class_counts_before"]
    for cls in range(4):
        n = before[str(cls)]
        copies = lengths[labels[starts] == cls]
        base = 2000 // n
        assert set(copies.tolist()) <= {base, base + 1} and copies.sum() == 2000
        assert len(copies) == (n if base else 2000)  # upsampled classes keep every example
    assert result.manifest["stats"]["examples_duplicated"] > 0


def test_bernoulli_replacement_mean_copies_within_error(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target="uniform", mode="bernoulli", replacement=True)
    stats = result.manifest["stats"]
    before = np.array([stats["class_counts_before"][str(i)] for i in range(4)])
    after = np.array([stats["class_counts_after"][str(i)] for i in range(4)])
    rates = np.array(stats["rates"])
    assert rates == pytest.approx(20_000 * 0.25 / before)
    frac = rates - np.floor(rates)
    assert np.all(np.abs(after - before * rates) <= 4 * np.sqrt(before * frac * (1 - frac)) + 1e-9)


@pytest.mark.parametrize("batch_size, drop", [(8, False), (10, True), (7, False)])
def test_balanced_batches_have_exact_composition(tmp_path, big_src, batch_size, drop):
    result = run(big_src, tmp_path / "out", target=(0.4, 0.3, 0.2, 0.1), batch_size=batch_size,
                 balanced_batches=True, drop_remainder=drop, replacement=True, size=3000)
    t = np.array([0.4, 0.3, 0.2, 0.1])
    files = sorted(p for p in (tmp_path / "out").iterdir() if p.name.startswith("part-"))
    groups = [pq.ParquetFile(f).read_row_group(i) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]
    sizes = [g.num_rows for g in groups]
    assert all(s == batch_size for s in sizes[:-1]) and (sizes[-1] == batch_size or not drop)
    unsorted = 0
    for group in groups:
        labels = group.column("label").to_numpy()
        shares = np.bincount(labels, minlength=4)
        assert np.all(np.abs(shares - len(labels) * t) < 1), shares
        unsorted += not np.all(np.diff(labels) >= 0)
    assert unsorted > len(groups) // 2  # rows are shuffled within batches
    after = result.manifest["stats"]["class_counts_after"]
    assert sum(after.values()) == sum(sizes)


def test_balanced_batches_same_bytes_for_any_threads_and_memory(tmp_path, big_src):
    common = dict(target="uniform", batch_size=16, balanced_batches=True)
    run(big_src, tmp_path / "a", threads=1, **common)
    run(big_src, tmp_path / "b", threads=4, memory=20_000, **common)
    assert read_dir(str(tmp_path / "a")).equals(read_dir(str(tmp_path / "b")))


@pytest.mark.parametrize("mode", ["exact", "bernoulli", "online"])
def test_seeds_differ_and_threads_do_not_matter(tmp_path, big_src, mode):
    extra = {"num_classes": 4} if mode == "online" else {}
    for name, threads, seed in (("t1", 1, 0), ("t4", 4, 0), ("s1", 2, 1)):
        run(big_src, tmp_path / name, threads=threads, seed=seed, target="uniform", mode=mode, **extra)
    t1, t4, s1 = (read_dir(str(tmp_path / n)) for n in ("t1", "t4", "s1"))
    assert t1.equals(t4)
    assert t1.column("key").to_pylist() != s1.column("key").to_pylist()


def test_class_prob_pairs_and_classes_from_data(tmp_path, big_src):
    result = run(big_src, tmp_path / "out", target={1: 0.5, 3: 0.5})
    stats = result.manifest["stats"]
    assert stats["num_classes"] == 4 and stats["target"] == [0, 0.5, 0, 0.5]
    after = stats["class_counts_after"]
    assert after["0"] == after["2"] == 0 and after["1"] == after["3"] > 0


def test_label_errors_count_and_locate_the_first(tmp_path):
    src = labelled(tmp_path / "src", [0, 1, 5, 1, 0, 7, None, 1])
    with pytest.raises(InputError, match=r"column 'label': 3 label\(s\) are not integers in \[0, 2\) "
                                         r"\(first: .*part-00000\.parquet, row 2: 5\)"):
        run(src, tmp_path / "out", target=(0.5, 0.5))
    with pytest.raises(InputError, match=r"3 label\(s\).*row 2: 5"):  # online finds it while streaming
        run(src, tmp_path / "out2", target=(0.5, 0.5), mode="online")
    floats = labelled(tmp_path / "f", [0.0, 1.0, 1.5, 0.0])
    with pytest.raises(InputError, match=r"1 label\(s\).*part-00001\.parquet, row 0: 1\.5"):
        run(floats, tmp_path / "out3", target=(0.5, 0.5))
    strings = labelled(tmp_path / "s", ["a", "b"])
    with pytest.raises(SchemaError, match=r"part-00000\.parquet, column 'label': type string"):
        run(strings, tmp_path / "out4", target=(0.5, 0.5))
    assert not any((tmp_path / d).exists() for d in ("out", "out2", "out3", "out4"))


@pytest.mark.parametrize("batches", [{}, {"batch_size": 2}, {"batch_size": 2, "balanced_batches": True}],
                         ids=["rows", "batches", "balanced"])
def test_bad_labels_found_while_streaming_are_counted_over_the_whole_input(tmp_path, batches):
    """--mode online has no counting pass: the first bad label stops the stream and the error counts every bad
    one and names the first, whether stratify writes rows or batches, as a command or a pipeline's last stage;
    neither DST nor a spill file is left behind."""
    src = labelled(tmp_path / "src", [0, 1, 0, 1, 5, 1, 0, 7, 1, 0], row_group_size=2)
    message = r"column 'label': 2 label\(s\) are not integers in \[0, 2\) \(first: .*part-00000\.parquet, row 4: 5\)"
    spill = tmp_path / "spill"
    spill.mkdir()
    with pytest.raises(InputError, match=message):
        run(src, tmp_path / "out", target="uniform", mode="online", num_classes=2, tmp_dir=str(spill), **batches)
    keys = "".join(f"\n{k.replace('_', '-')} = {str(v).lower()}" for k, v in batches.items())
    toml = tmp_path / "p.toml"
    toml.write_text(f'tmp-dir = "{spill}"\n[input]\npath = "{src}"\n[[stage]]\nop = "stratify"\ntarget = "uniform"\n'
                    f'mode = "online"\nnum-classes = 2{keys}\n[output]\npath = "{tmp_path / "piped"}"\n')
    with pytest.raises(InputError, match=f"{toml}: stage 1 \\(stratify\\): {message}"):
        run_pipeline(load(str(toml)), QUIET)
    assert not (tmp_path / "out").exists() and not (tmp_path / "piped").exists() and not os.listdir(spill)


def test_the_counting_pass_holds_one_count_per_class_however_many_values_the_labels_take(tmp_path):
    """200,000 distinct labels, most past the most classes: the first pass keeps at most one count per class and one
    for all the others, and the error names the largest label as before."""
    labels = np.arange(200_000, dtype=np.int64) * 7
    chunk = Chunk(pa.record_batch({"label": labels}), rng.example_ids(0, 0, len(labels)))
    context = Context(0, pa.schema([("label", pa.int64())]), "src", str)
    tally = OP.first_pass(StratifyOptions(target="uniform"), context.schema).of(context, chunk)
    counts = tally.counts["label_counts"]
    assert len(counts) <= MAX_CLASSES // 7 + 2 and sum(counts.values()) == 200_000
    assert tally.high["label"] == 7 * 199_999
    src = labelled(tmp_path / "src", labels.tolist())
    with pytest.raises(InputError, match=r"labels go up to 1399993; pass --num-classes or a --target list"):
        run(src, tmp_path / "out", target="uniform")


def test_float_labels_that_are_integers_are_accepted(tmp_path):
    src = labelled(tmp_path / "src", [0.0, 1.0, 1.0, 0.0, 1.0])
    result = run(src, tmp_path / "out", target="uniform")
    assert result.manifest["stats"]["class_counts_after"] == {"0": 2, "1": 2}


def test_zero_probability_class_with_a_target_is_an_error(tmp_path):
    src = labelled(tmp_path / "src", [0, 1, 0, 1])
    with pytest.raises(InputError, match="class 2 has initial probability 0 .* --target gives it 0.2"):
        run(src, tmp_path / "out", target=(0.4, 0.4, 0.2))
    with pytest.raises(UsageError, match=r"class 1 has initial probability 0 \(--init-probs\)"):
        run(src, tmp_path / "out", target=(0.5, 0.5), mode="bernoulli", init_probs=(1.0, 0.0))
    with pytest.raises(UsageError, match="--size 9: without --replacement the data allows at most 4 "):
        run(src, tmp_path / "out", target="uniform", size=9)
    with pytest.raises(UsageError, match="needs --num-classes"):
        run(src, tmp_path / "out", target="uniform", mode="online")


def test_tfrecord_input_gives_the_same_selection(tmp_path, run_cli):
    table = make_table(400, seed=2)
    src = write_parquet_shards(str(tmp_path / "pq"), table, shards=2, row_group_size=100)
    result = run_cli("convert", src, tmp_path / "tfr", "--to", "tfrecord", "--shard-rows", 200, "-q")
    assert result.exit_code == 0  # same shards and rows, so the same example ids
    run(src, tmp_path / "a", target="uniform")
    run(str(tmp_path / "tfr"), tmp_path / "b", target="uniform")
    assert read_dir(str(tmp_path / "a")).equals(read_dir(str(tmp_path / "b")))
