"""bucket --balance and --cost: exact class quotas in every full batch of every bucket, oversampling, cost budgets."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.run_settings import RunSettings
from batchtool.ops.boundaries import assign_buckets
from batchtool.exec.driver import run_operation
from batchtool.ops.bucket import OP, BucketOptions
from batchtool.ops.batching import BatchBudget
from batchtool.ops.quotas import QuotaLayout
from batchtool.io.output import OutputOptions
from conftest import SAMPLE, data_bytes, read_dir, write_parquet_shards

QUIET = RunSettings(threads=2, quiet=True)
TOTALS_SLACK = 1.5
"""How far a class's running total may be from j x B x t_i rows: each batch rounds by under one row, and the
rotation keeps the sum within about one (1.10 is the worst seen over 20,000 random targets)."""


def labelled(counts: list[int], seed: int, max_length: int = 60) -> pa.Table:
    """Rows of each class (counts[c] of class c) with random lengths, shuffled; keys number the rows."""
    gen = np.random.default_rng(seed)
    labels = gen.permutation(np.repeat(np.arange(len(counts)), counts))
    lengths = gen.integers(1, max_length, len(labels))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.table({"key": pa.array(np.arange(len(labels)), pa.int64()), "label": pa.array(labels, pa.int64()),
                     "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(offsets[-1], np.int64)))})


def run(directory: str, table: pa.Table, name: str = "out", settings: RunSettings = QUIET,
        memory: int | None = None, **options) -> tuple[pa.Table, dict]:
    src = os.path.join(directory, "src")
    if not os.path.exists(src):
        write_parquet_shards(src, table, shards=2, row_group_size=30)
    dst = os.path.join(directory, name)
    result = run_operation(OP, BucketOptions(**options), src, dst, OutputOptions(), replace(settings, memory=memory),
                           seed=3)
    return read_dir(dst), result.manifest["stats"]


def per_bucket_batches(out: pa.Table) -> dict[int, list[pa.Table]]:
    """Each bucket's batches in output order."""
    found: dict[int, list[pa.Table]] = {}
    ids = out.column("batch").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, int)
    for s, e in zip(starts, np.r_[starts[1:], len(ids)]):
        batch = out.slice(s, e - s)
        found.setdefault(batch.column("bucket")[0].as_py(), []).append(batch)
    return found


classes = st.lists(st.integers(0, 40), min_size=2, max_size=4)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(any), st.integers(1, 40), st.integers(1, 60))
@settings(max_examples=300, deadline=None)
def test_quotas_round_each_batch_and_their_running_totals_stay_near_the_target(weights, batch_size, batches):
    t = np.array(weights) / sum(weights)
    given_rows = np.zeros(len(t))
    for j, quotas in zip(range(1, batches + 1), QuotaLayout(tuple(t.tolist()), batch_size, 0).full_quotas()):
        assert quotas.sum() == batch_size and (np.abs(quotas - batch_size * t) < 1).all()
        given_rows += quotas
        assert (np.abs(given_rows - j * batch_size * t) < TOTALS_SLACK).all()


@given(classes, st.integers(1, 9), st.one_of(st.none(), st.lists(st.integers(1, 5), min_size=4, max_size=4)),
       st.lists(st.integers(2, 59), min_size=1, max_size=3, unique=True), st.booleans(), st.integers(0, 3),
       st.one_of(st.none(), st.integers(60, 300)))
@settings(max_examples=25, deadline=None)
def test_every_full_batch_holds_its_exact_quotas_and_rows_come_from_their_bucket(counts, batch_size, weights,
                                                                                boundaries, drop, seed, tokens):
    """With --max-tokens the budget decides each bucket's rows per batch (`batch_rows`), split into quotas."""
    if sum(counts) == 0:
        counts[0] = 1
    k = len(counts)
    target = tuple(w / sum(weights[:k]) for w in weights[:k]) if weights else "uniform"
    t = np.full(k, 1 / k) if weights is None else np.array(target)
    if np.any(np.array(counts)[t > 0] == 0):
        return  # a targeted class with no rows is refused (tested below)
    table = labelled(counts, seed)
    bounds = tuple(sorted(boundaries))
    with tempfile.TemporaryDirectory() as tmp:
        sizing = dict(batch_size=(batch_size,)) if tokens is None else dict(max_tokens=tokens)
        out, stats = run(tmp, table, boundaries=bounds, balance="label", target=target, drop_remainder=drop,
                         **sizing)
    lengths = np.array([len(x) for x in table.column("tokens").to_pylist()])
    in_bucket = assign_buckets(lengths, bounds)
    labels = table.column("label").to_numpy()
    keys = out.column("key").to_numpy()
    assert len(np.unique(keys)) == len(keys)  # no duplicates without --oversample
    batches = per_bucket_batches(out)
    for b in range(len(bounds) + 1):
        mine = batches.get(b, [])
        batch_size = stats["buckets"][b]["batch_rows"]
        if tokens is not None:
            for batch in mine:
                assert batch.num_rows * max(batch.column("length").to_numpy()) <= tokens
        quotas = QuotaLayout(tuple(t.tolist()), batch_size, 0).full_quotas()
        available = np.bincount(labels[in_bucket == b], minlength=k)
        used = np.zeros(k, dtype=np.int64)
        for i, batch in enumerate(mine):
            got = np.bincount(batch.column("label").to_numpy(), minlength=k)
            rows = batch.column("key").to_numpy()
            assert set(in_bucket[rows]) == {b}  # a subset of the bucket's own input rows
            assert (labels[rows] == batch.column("label").to_numpy()).all()
            if batch.num_rows == batch_size:
                want = next(quotas)
                assert (got == want).all() and (np.abs(want - batch_size * t) < 1).all()
            else:  # the partial batch: last in its bucket, kept unless --drop-remainder
                assert i == len(mine) - 1 and not drop
            used += got
        full = sum(1 for batch in mine if batch.num_rows == batch_size)
        nxt = QuotaLayout(tuple(t.tolist()), batch_size, 0).full_quotas()
        spent = sum((next(nxt) for _ in range(full + 1)), np.zeros(k, dtype=np.int64))
        assert np.any(spent > available)  # one more full batch would not have fitted
        row = stats["buckets"][b]
        assert row["class_rows_in"] == available.tolist() and row["class_rows_out"] == used.tolist()
        assert row["class_dropped"] == (available - used).tolist()
    assert stats["examples_dropped"]["unbalanced"] == table.num_rows - out.num_rows


@given(st.lists(st.integers(0, 25), min_size=2, max_size=4), st.integers(2, 9),
       st.lists(st.integers(1, 3), min_size=4, max_size=4), st.integers(0, 3))
@settings(max_examples=15, deadline=None)
def test_oversample_repeats_rare_classes_and_totals_follow_the_target(counts, batch_size, weights, seed):
    k = len(counts)
    counts = [max(1, c) for c in counts]
    t = np.array(weights[:k]) / sum(weights[:k])
    table = labelled(counts, seed)
    with tempfile.TemporaryDirectory() as tmp:
        out, stats = run(tmp, table, boundaries=(30,), batch_size=(batch_size,), balance="label",
                         target=tuple(t.tolist()), oversample=True)
    lengths = np.array([len(x) for x in table.column("tokens").to_pylist()])
    labels = table.column("label").to_numpy()
    keys = out.column("key").to_numpy()
    in_bucket = assign_buckets(lengths, (30,))
    complete = [len(np.unique(labels[in_bucket == b])) == k for b in (0, 1)]  # else nothing can balance it
    batches = per_bucket_batches(out)
    assert sorted(batches) == [b for b in (0, 1) if complete[b]]
    for b, mine in batches.items():
        assert all(batch.num_rows == batch_size for batch in mine)
        rows = np.concatenate([batch.column("key").to_numpy() for batch in mine])
        written = np.bincount(labels[rows], minlength=k)
        assert (np.abs(written - len(mine) * batch_size * t) < TOTALS_SLACK).all()  # about one batch's rounding
        bucket_rows = np.flatnonzero(in_bucket == b)
        assert set(bucket_rows) == set(rows)  # nothing dropped, nothing from another bucket
        times = np.bincount(rows, minlength=table.num_rows)[bucket_rows]
        for c in range(k):  # a class's rows repeat evenly: each as often as the others, or once more
            mine_c = times[labels[bucket_rows] == c]
            assert mine_c.max() - mine_c.min() <= 1
    assert stats["balance"]["examples_repeated"] == len(keys) - len(np.unique(keys))
    assert stats["examples_dropped"]["unbalanced"] == sum(int((in_bucket == b).sum()) for b in (0, 1)
                                                          if not complete[b])


def test_a_bucket_missing_a_targeted_class_is_dropped_and_counted(tmp_path):
    table = labelled([30, 30], 0)
    lengths = np.array([len(x) for x in table.column("tokens").to_pylist()])
    labels = table.column("label").to_numpy()
    short_ones = int(((lengths < 10) & (labels == 1)).sum())
    keep = ~((lengths < 10) & (labels == 1))  # bucket 0 gets no example of class 1
    out, stats = run(str(tmp_path), table.filter(pa.array(keep)), boundaries=(10,), batch_size=(4,),
                     balance="label", oversample=True)
    assert short_ones and set(out.column("bucket").to_pylist()) == {1}
    assert stats["buckets"][0]["class_dropped"] == stats["buckets"][0]["class_rows_in"]


def test_balance_with_max_tokens_splits_the_budget_s_rows_into_quotas(tmp_path):
    table = labelled([60, 30, 20], 1)
    out, stats = run(str(tmp_path), table, boundaries=(20, 40), max_tokens=200, balance="label")
    for b, mine in per_bucket_batches(out).items():
        rows = stats["buckets"][b]["batch_rows"]
        for batch in mine:
            assert batch.num_rows * max(batch.column("length").to_numpy()) <= 200
            if batch.num_rows == rows:
                assert np.ptp(np.bincount(batch.column("label").to_numpy(), minlength=3)) <= 1
    assert [r["batch_rows"] for r in stats["buckets"]] == [200 // 19, 200 // 39, 200 // 59]


@pytest.mark.parametrize("oversample", [False, True])
def test_balanced_bytes_are_the_same_for_any_threads_and_memory(tmp_path, oversample):
    table = labelled([300, 40, 10], 2, max_length=200)
    options = dict(auto_buckets=3, batch_size=(10,), balance="label", target=(0.5, 0.3, 0.2), oversample=oversample)
    run(str(tmp_path), table, "a", RunSettings(threads=1, quiet=True), memory=1 << 30, **options)
    run(str(tmp_path), table, "b", RunSettings(threads=2, quiet=True), memory=100 << 10, **options)
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))


# --- the cost model ---------------------------------------------------------------------------------------------

def test_quadratic_cost_counts_the_padded_length_squared():
    budget = BatchBudget(max_tokens=1000, cost="quadratic")
    assert budget.fits(10, 10) and not budget.fits(11, 10) and budget.rows_at(10) == 10 and budget.rows_at(0) == 1000
    assert budget.fits_alone(np.array([31, 32])).tolist() == [True, False]
    assert BatchBudget(max_tokens=1000, max_rows=4, cost="quadratic").rows_at(5) == 4


def test_quadratic_budgets_hold_and_give_short_buckets_larger_batches_than_linear(tmp_path):
    table = labelled([400], 4, max_length=160)
    pads = (10, 40, 159)
    common = dict(boundaries=(11, 41), pad_to_boundary=True)
    linear, _ = run(str(tmp_path), table, "lin", max_tokens=159, **common)  # one row of the longest length
    quad, _ = run(str(tmp_path), table, "quad", max_tokens=159 ** 2, cost="quadratic", **common)
    for out, cost in ((linear, lambda r, p: r * p), (quad, lambda r, p: r * p * p)):
        for mine in per_bucket_batches(out).values():
            for batch in mine:
                b = batch.column("bucket")[0].as_py()
                pad = pads[b] if b < 2 else batch.column("length").to_numpy().max()  # the last bucket is unbounded
                assert cost(batch.num_rows, pad) <= (159 if out is linear else 159 ** 2)
    largest = {name: {b: max(x.num_rows for x in mine) for b, mine in per_bucket_batches(out).items()}
               for name, out in (("lin", linear), ("quad", quad))}
    assert largest["lin"][0] == 159 // 10 and largest["quad"][0] > largest["lin"][0]
    assert largest["lin"][1] == 159 // 40 and largest["quad"][1] == 159 ** 2 // 40 ** 2 > largest["lin"][1]
    assert largest["quad"][2] <= 2 * largest["lin"][2]  # the longest bucket: about the same batches either way


# --- the command line -------------------------------------------------------------------------------------------

def test_cli_balance_on_sample_data_summary_manifest_and_dry_run(tmp_path, run_cli):
    dst = tmp_path / "out"
    result = run_cli("bucket", os.path.join(SAMPLE, "parquet"), dst, "--balance", "label", "--auto-buckets", "4",
                     "--batch-size", "20")
    assert result.exit_code == 0, result.stderr
    stats = json.loads((dst / ".batchtool_manifest.json").read_text())["stats"]
    balance = stats["balance"]
    assert balance["batch_share_min"] == balance["batch_share_max"] == [0.25] * 4
    assert "warning: --balance dropped 95.7% of the examples (3,829 of 4,000" in result.stderr
    assert "balanced by label: rows per class 0: 3,602->" in result.stderr
    assert "share of each batch 0: 25.0%-25.0%" in result.stderr
    assert f"{stats['examples_dropped']['unbalanced']:,} unbalanced" in result.stderr
    toml = tmp_path / "p.toml"
    toml.write_text(f'[input]\npath = "{os.path.join(SAMPLE, "parquet")}"\n[[stage]]\nop = "bucket"\n'
                    'auto-buckets = 4\nbatch-size = 20\nbalance = "label"\n'
                    f'[output]\npath = "{tmp_path / "run"}"\n')
    planned = run_cli("run", toml, "--dry-run")
    assert planned.exit_code == 0, planned.stderr
    assert f"{stats['batches']} batches" in planned.output + planned.stderr
    ran = run_cli("run", toml, "-q")
    assert ran.exit_code == 0 and data_bytes(str(tmp_path / "run")) == data_bytes(str(dst))


@pytest.mark.parametrize("args, message", [
    (["--balance", "nope"], "--balance nope: no such column"),
    (["--balance", "key"], "--balance key: column is string, expected integer class labels"),
    (["--balance", "label", "--target", "0.5,0.5"], "labels must be integers in [0, 2) (--target gives 2 classes)"),
    (["--balance", "label", "--target", "0.5,0.6,0,0"], "--target 0.5,0.6,0,0: probabilities sum to 1.1"),
    (["--oversample"], "--oversample goes with --balance LABEL_COLUMN"),
    (["--target", "0.5,0.5"], "--target goes with --balance"),
    (["--balance", "label", "--order", "sorted"], "--balance with --order sorted"),
    (["--cost", "quadratic"], "--cost quadratic goes with --max-tokens"),
    (["--balance", "label", "--target", "0=0.5,9=0.5"], "class 9 has initial probability 0"),
])
def test_balance_and_cost_errors_are_one_line_exit_2(tmp_path, run_cli, args, message):
    dst = tmp_path / "out"
    result = run_cli("bucket", os.path.join(SAMPLE, "parquet"), dst, "--auto-buckets", "4", "--batch-size", "20",
                     *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not dst.exists()


def test_a_row_over_a_quadratic_budget_names_its_cost(tmp_path, run_cli):
    result = run_cli("bucket", os.path.join(SAMPLE, "parquet"), tmp_path / "out", "--boundaries", "50",
                     "--max-tokens", "10000", "--cost", "quadratic")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "steps exceeds --max-tokens 10000 (--cost quadratic: " in result.stderr
    assert "pass --drop-oversize" in result.stderr and not (tmp_path / "out").exists()


def test_a_class_with_target_zero_never_gets_a_row():
    """The remainder rows go to classes with a share: here the others run ahead of their running target and a
    zero class used to win a row (batch 17 was [1, 4, 4, 4, 5, 5])."""
    import itertools

    from batchtool.ops.quotas import QuotaLayout

    target = np.array([0, 7, 7, 7, 8, 8]) / 37
    for quotas in itertools.islice(QuotaLayout(tuple(target), 23, 0).full_quotas(), 200):
        assert quotas[0] == 0 and quotas.sum() == 23
