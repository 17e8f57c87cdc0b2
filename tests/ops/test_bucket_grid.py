"""bucket over two lengths: the joint histogram, the grid's optimality, the two-length budget on every batch, every
row once, exact small outputs, determinism and the one-line errors."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.errors import InputError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.io.output import OutputOptions
from batchtool.ops.boundaries import assign_buckets, padded_elements
from batchtool.ops.bucket import OP, BucketOptions
from batchtool.ops.bucket import grid
from batchtool.ops.bucket.grid import GridBudget, choose_cells, grid_padding, merge_pairs, pair_counts
from conftest import data_bytes, read_dir, write_parquet_shards

QUIET = RunSettings(threads=2, quiet=True)
GRID = dict(length=("src", "tgt"), auto_buckets=4)


def table(first: list[int], second: list[int]) -> pa.Table:
    """Rows with an id, a `src` sequence of `first` steps and a `tgt` of `second` (values name the row)."""
    return pa.table({"id": pa.array(range(len(first)), pa.int64()),
                     "src": pa.array([[i] * a for i, a in enumerate(first)], pa.list_(pa.int32())),
                     "tgt": pa.array([[-i] * b for i, b in enumerate(second)], pa.list_(pa.int32())),
                     "in_len": pa.array(first, pa.int64()), "out_len": pa.array(second, pa.int64())})


def run(tmp_path, data: pa.Table, name: str = "out", run: RunSettings = QUIET, memory: int | None = None,
        **options) -> tuple[pa.Table, dict]:
    src = str(tmp_path / "src")
    if not os.path.exists(src):
        write_parquet_shards(src, data, shards=3, row_group_size=7)
    result = run_operation(OP, BucketOptions(**options), src, str(tmp_path / name), OutputOptions(),
                           replace(run, memory=memory), seed=0)
    return read_dir(str(tmp_path / name)), result.manifest


def batches_of(out: pa.Table) -> list[pa.Table]:
    ids = out.column("batch").to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, np.int64)
    return [out.slice(s, e - s) for s, e in zip(starts, np.r_[starts[1:], len(ids)])]


def padded_shape(batch: pa.Table) -> tuple[int, int]:
    """A batch's padded lengths, checked to be its rows' longest in each dimension and the same for every row."""
    widths = {(len(a), len(b)) for a, b in zip(batch.column("src").to_pylist(), batch.column("tgt").to_pylist())}
    assert len(widths) == 1
    return widths.pop()


# --- the joint histogram -------------------------------------------------------------------------------------


def test_pair_counts_merge_exactly_and_stop_at_the_limit():
    a = pair_counts(np.array([3, 1, 3, 3]), np.array([2, 0, 2, 1]))
    assert a.tolist() == [[1, 0, 1], [3, 1, 1], [3, 2, 2]]
    b = pair_counts(np.array([3, 5]), np.array([2, 5]))
    assert merge_pairs(a, b, 64 << 20).tolist() == [[1, 0, 1], [3, 1, 1], [3, 2, 3], [5, 5, 1]]
    # --balance: the class is a third key, counted and merged the same way
    c = pair_counts(np.array([3, 3, 3]), np.array([2, 2, 2]), np.array([0, 1, 1]))
    assert c.tolist() == [[3, 2, 0, 1], [3, 2, 1, 2]]
    assert merge_pairs(c, pair_counts(np.array([3]), np.array([2]), np.array([1])), 64 << 20).tolist() == [
        [3, 2, 0, 1], [3, 2, 1, 3]]


def test_the_joint_histogram_is_bounded_by_the_distinct_pairs_it_counts(tmp_path, monkeypatch):
    # what a pair costs made 40 MB, so that four distinct pairs pass the 128 MB share of --memory 1GB: one
    # error naming --memory from the first pass, before anything is spilled (the path 5.6 million pairs take)
    monkeypatch.setattr(grid, "PAIR_BYTES", 40 << 20)
    with pytest.raises(InputError, match=r"counting 4 distinct \(length, length\) pairs takes about 160.0 MB at "
                                         r"once, more than --memory 1.0 GB allows"):
        run(tmp_path, table([1, 2, 2, 3, 3], [1, 1, 1, 2, 3]), memory=1 << 30, length=("src", "tgt"),
            auto_buckets=2, batch_size=(2,))
    assert not os.path.exists(tmp_path / "out")
    labelled = table([1, 2, 2], [1, 1, 1]).append_column("label", pa.array([0, 0, 1], pa.int64()))
    with pytest.raises(InputError, match=r"counting 3 distinct \(length, length, class\) keys takes about 160.0 MB"):
        run(tmp_path / "labelled", labelled, "balanced", memory=1 << 30, length=("src", "tgt"), auto_buckets=2,
            batch_size=(2,), balance="label")
    assert not os.path.exists(tmp_path / "labelled" / "balanced")


# --- the grid: never worse than the best product grid, exact given its first-length buckets ----------------


def best_cuts(counts: np.ndarray, most: int) -> int:
    """The least `padded_elements` of at most `most` buckets over a histogram, by trying every cut."""
    values = np.flatnonzero(counts)
    return min(padded_elements(counts, cut) for m in range(min(most, max(1, len(values)))) for cut in
               itertools.combinations(values[1:].tolist(), m))


def best_product_grid(pairs: np.ndarray, k: int) -> int:
    """Every product grid of at most k cells (the same second-length cuts in every first-length bucket)."""
    one, two = (np.bincount(pairs[:, d], weights=pairs[:, 2]).astype(np.int64) for d in (0, 1))
    return min(best_cuts(one, k1) + best_cuts(two, k // k1) for k1 in range(1, k + 1))


pair_sets = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.integers(1, 3)), min_size=1, max_size=12,
                     unique_by=lambda t: t[:2])


@given(pair_sets, st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_the_grid_pads_no_more_than_the_best_product_grid_and_each_bucket_is_cut_optimally(rows, k):
    pairs = np.array(sorted(rows), dtype=np.int64)
    first, second = choose_cells(pairs, k)
    assert sum(len(b) + 1 for b in second) <= k and len(second) == len(first) + 1
    cost = grid_padding(pairs, first, second)
    assert cost <= best_product_grid(pairs, k)
    stripes = assign_buckets(pairs[:, 0], first)
    for i, edges in enumerate(second):  # each first-length bucket's second lengths cut as well as any cut can
        counts = np.bincount(pairs[stripes == i, 1], weights=pairs[stripes == i, 2]).astype(np.int64)
        if counts.any():
            assert padded_elements(counts, edges) == best_cuts(counts, len(second) and k // len(second))


def test_correlated_lengths_get_first_length_buckets_only():
    # the second length follows the first: cutting the first alone pads least
    pairs = np.array([[10 * i, i, 5] for i in range(1, 9)], dtype=np.int64)
    first, second = choose_cells(pairs, 4)
    assert first == (21, 41, 61) and second == ((), (), (), ())  # each one more than its bucket's longest
    assert grid_padding(pairs, first, second) == 5 * (2 * (20 + 40 + 60 + 80) + 2 * (2 + 4 + 6 + 8))


# --- the budget, on its own ---------------------------------------------------------------------------------

costs = st.sampled_from([dict(cost="linear"), dict(cost="quadratic"), dict(coefficients=(1.0, 0.5, 2.0)),
                         dict(coefficients=(0.0, 0.0, 1.0))])


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=40), st.integers(1, 2000), costs,
       st.one_of(st.none(), st.integers(1, 6)))
@settings(max_examples=150, deadline=None)
def test_no_batch_cut_exceeds_the_budget_and_each_closes_only_when_full(rows, max_tokens, cost, max_rows):
    limit = GridBudget(max_tokens=max_tokens, max_rows=max_rows, **cost)
    first, second = (np.array([r[d] for r in rows], dtype=np.int64) for d in (0, 1))
    keep = limit.fits_alone(first, second)
    first, second = first[keep], second[keep]
    sizes = limit.cut(first, second)
    assert sizes.sum() == len(first) and (sizes > 0).all()
    start = 0
    for i, size in enumerate(sizes.tolist()):
        w, t = first[start:start + size].max(), second[start:start + size].max()
        assert limit.batch_cost(size, w, t) <= max_tokens and (max_rows is None or size <= max_rows)
        if i + 1 < len(sizes):
            w2, t2 = max(w, first[start + size]), max(t, second[start + size])
            assert limit.batch_cost(size + 1, w2, t2) > max_tokens or size + 1 > (max_rows or size + 1)
        start += size


# --- end to end ----------------------------------------------------------------------------------------------


def test_an_exact_small_grid(tmp_path):
    # two clusters of input lengths, each with short and long outputs
    first = [2, 2, 3, 3, 9, 9, 10, 10]
    second = [1, 6, 1, 6, 1, 6, 1, 7]
    out, manifest = run(tmp_path, table(first, second), batch_size=(2,), order="sorted", **GRID)
    stats = manifest["stats"]
    assert stats["boundaries"] == [[4], [[2], [2]]] and stats["grid"] == [2, 2]
    assert [(c["cell"], c["lengths"], c["examples"]) for c in stats["buckets"]] == [
        ([0, 0], [[0, 4], [0, 2]], 2), ([0, 1], [[0, 4], [2, None]], 2),
        ([1, 0], [[4, None], [0, 2]], 2), ([1, 1], [[4, None], [2, None]], 2)]
    shapes = [padded_shape(b) for b in batches_of(out)]
    assert shapes == [(3, 1), (3, 6), (10, 1), (10, 7)]
    assert sorted(out.column("id").to_pylist()) == list(range(8))
    assert out.column("length").to_pylist() == [2, 3, 2, 3, 9, 10, 9, 10]
    assert out.column("length_2").to_pylist() == [1, 1, 6, 6, 1, 1, 6, 7]
    assert out.schema.names[-4:] == ["batch", "bucket", "length", "length_2"]
    real = sum(first) + sum(second)
    assert stats["real_elements"] == real and stats["padded_elements"] == 2 * (3 + 1 + 3 + 6 + 10 + 1 + 10 + 7)
    assert list(manifest["options"]["length"]) == ["src", "tgt"]
    # the second sequence pads with its own rows' values then zeros
    assert out.column("tgt").to_pylist()[6] == [-5] * 6 + [0]  # row 5: 6 steps, padded to 7


def test_an_exact_small_balanced_grid(tmp_path):
    # cell 0 (short inputs): six rows, four of class 0 and two of class 1; cell 1 (long inputs): two of each
    data = table([2, 2, 2, 2, 2, 2, 9, 9, 9, 9], [1, 1, 1, 1, 1, 1, 3, 3, 3, 3])
    data = data.append_column("label", pa.array([0, 0, 0, 0, 1, 1, 0, 1, 0, 1], pa.int64()))
    out, manifest = run(tmp_path, data, batch_size=(2,), balance="label", length=("src", "tgt"), auto_buckets=2,
                        drop_remainder=True)
    stats = manifest["stats"]
    assert stats["grid"] == [1, 1]
    per_batch = [(set(b.column("bucket").to_pylist()), sorted(b.column("label").to_pylist())) for b in batches_of(out)]
    assert sorted(per_batch, key=lambda x: min(x[0])) == [({0}, [0, 1])] * 2 + [({1}, [0, 1])] * 2
    assert stats["examples_dropped"]["unbalanced"] == 2 and [c["balanced_batches"] for c in stats["buckets"]] == [2, 2]
    assert [padded_shape(b) for b in batches_of(out)] == [(2, 1) if 0 in c else (9, 3) for c, _ in per_batch]
    out, manifest = run(tmp_path, data, "over", batch_size=(2,), balance="label", oversample=True, drop_remainder=True,
                        length=("src", "tgt"), auto_buckets=2)
    labels = [sorted(b.column("label").to_pylist()) for b in batches_of(out) if b.column("bucket")[0].as_py() == 0]
    assert labels == [[0, 1]] * 4 and manifest["stats"]["examples_dropped"]["unbalanced"] == 0
    ids = [b.column("id").to_pylist() for b in batches_of(out) if b.column("bucket")[0].as_py() == 0]
    assert sorted(i for batch in ids for i in batch if i < 4) == [0, 1, 2, 3]  # every row of class 0 once


def test_balanced_grid_batches_fit_max_tokens_and_hold_exact_quotas(tmp_path):
    rng = np.random.default_rng(11)
    first, second = rng.integers(1, 40, 240).tolist(), rng.integers(1, 12, 240).tolist()
    data = table(first, second).append_column("label", pa.array(rng.integers(0, 2, 240), pa.int64()))
    args = dict(length=("src", "tgt"), auto_buckets=4, max_tokens=200, balance="label", drop_remainder=True)
    out, manifest = run(tmp_path, data, "a", RunSettings(threads=1, quiet=True), memory=1 << 30, **args)
    rows = [c["batch_rows"] for c in manifest["stats"]["buckets"]]
    limit = GridBudget(max_tokens=200)
    assert batches_of(out)
    for batch in batches_of(out):
        cell = batch.column("bucket")[0].as_py()
        assert batch.num_rows == rows[cell] and limit.batch_cost(batch.num_rows, *padded_shape(batch)) <= 200
        counts = np.bincount(batch.column("label").to_numpy(), minlength=2)
        assert abs(int(counts[0]) - int(counts[1])) <= batch.num_rows % 2
    run(tmp_path, data, "b", RunSettings(threads=2, quiet=True), memory=256 << 10, **args)
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))


@given(st.lists(st.tuples(st.integers(0, 25), st.integers(0, 12)), min_size=1, max_size=60), st.integers(30, 400),
       st.sampled_from(["linear", "quadratic"]), st.integers(1, 6), st.booleans())
@settings(max_examples=12, deadline=None)
def test_every_batch_fits_max_tokens_and_every_row_appears_once(tmp_path_factory, rows, max_tokens, cost, k, fixed):
    tmp_path = tmp_path_factory.mktemp("grid")
    first, second = [r[0] for r in rows], [r[1] for r in rows]
    out, manifest = run(tmp_path, table(first, second), length=("src", "tgt"), auto_buckets=k, max_tokens=max_tokens,
                        cost=cost, drop_oversize=True, pad_to_boundary=fixed)
    limit = GridBudget(max_tokens=max_tokens, cost=cost)
    written = out.column("id").to_pylist()
    dropped = manifest["stats"]["examples_dropped"]["oversize"]
    assert len(written) == len(set(written)) and len(written) + dropped == len(rows)
    biggest = 0
    for batch in batches_of(out):
        w, t = padded_shape(batch)
        cost_of = int(limit.batch_cost(batch.num_rows, w, t))
        assert cost_of <= max_tokens
        biggest = max(biggest, cost_of)
        cells = set(batch.column("bucket").to_pylist())
        assert len(cells) == 1
    assert manifest["stats"]["max_batch_cost"] == biggest
    for i in set(range(len(rows))) - set(written):  # only rows over the budget alone were dropped
        assert fixed or limit.row_cost(first[i], second[i]) > max_tokens


def test_cost_coefficients_bound_every_batch(tmp_path):
    rng = np.random.default_rng(3)
    first = rng.integers(1, 40, 200).tolist()
    second = [max(1, a // 4 + int(rng.integers(-2, 3))) for a in first]
    out, manifest = run(tmp_path, table(first, second), length=("in_len", "out_len"), sequence=("src", "tgt"),
                        auto_buckets=6, max_tokens=20_000, cost_coefficients=(1.0, 2.0, 3.0))
    costs = [b.num_rows * (w * w + 2 * w * t + 3 * t) for b in batches_of(out) for w, t in [padded_shape(b)]]
    assert max(costs) <= 20_000 and manifest["stats"]["max_batch_cost"] == max(costs)
    assert list(manifest["options"]["cost_coefficients"]) == [1.0, 2.0, 3.0]
    assert manifest["stats"]["cost"] == {"model": "coefficients", "coefficients": [1.0, 2.0, 3.0],
                                         "max_tokens": 20_000}
    assert sorted(out.column("id").to_pylist()) == list(range(200))


def test_same_bytes_for_any_threads_and_memory(tmp_path):
    rng = np.random.default_rng(5)
    first = rng.integers(0, 60, 300).tolist()
    second = rng.integers(0, 20, 300).tolist()
    data = table(first, second)
    args = dict(length=("src", "tgt"), auto_buckets=6, max_tokens=300)
    run(tmp_path, data, "a", RunSettings(threads=1, quiet=True), **args)
    run(tmp_path, data, "b", RunSettings(threads=3, quiet=True), memory=64 << 20, **args)
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))


def test_a_row_over_the_budget_alone_stops_the_run_naming_it(tmp_path):
    with pytest.raises(InputError, match=r"part-00001.parquet, row 0: an example of lengths 9 x 4 padded to 9 x 4 steps costs 13, "
                                         "more than --max-tokens 10"):
        run(tmp_path, table([1, 9, 2], [1, 4, 2]), length=("src", "tgt"), auto_buckets=2, max_tokens=10)


@pytest.mark.parametrize("options, message", [
    (dict(length=("src", "tgt"), sequence=("src",)), "1 --sequence columns for 2 --length columns"),
    (dict(length=("src", "tgt", "id")), "3 lengths given"),
    (dict(length=("src", "tgt"), mask=True), "--mask is not available with two --length"),
    (dict(length=("src", "tgt"), balance="id", order="sorted"), "--balance with --order sorted"),
    (dict(length=("src", "tgt"), cost="quadratic", cost_coefficients=(1, 1, 1), max_tokens=9, batch_size=None),
     "not both"),
    (dict(length="src", cost_coefficients=(1, 1, 1), max_tokens=9, batch_size=None), "needs two --length"),
])
def test_options_a_grid_refuses(options, message):
    given = dict(auto_buckets=2, batch_size=(4,), **{k: v for k, v in options.items() if k != "batch_size"})
    if "batch_size" in options:
        given.pop("batch_size")
    with pytest.raises(UsageError, match=message):
        BucketOptions(**given)


def test_grid_cells_follow_tensorflow_assignment_in_each_dimension(tmp_path):
    rng = np.random.default_rng(9)
    first, second = rng.integers(0, 30, 120).tolist(), rng.integers(0, 30, 120).tolist()
    out, manifest = run(tmp_path, table(first, second), length=("src", "tgt"), auto_buckets=6, batch_size=(5,))
    b1, b2 = manifest["stats"]["boundaries"]
    ids = out.column("id").to_numpy()
    stripes = assign_buckets(np.array(first)[ids], b1)
    offsets = np.cumsum([0, *(len(b) + 1 for b in b2)])
    expected = [offsets[i] + assign_buckets(np.array([second[r]]), b2[i])[0] for i, r in zip(stripes, ids)]
    assert out.column("bucket").to_numpy().tolist() == expected
    assert [c["cell"] for c in manifest["stats"]["buckets"]] == [[i, j] for i, b in enumerate(b2)
                                                                  for j in range(len(b) + 1)]
