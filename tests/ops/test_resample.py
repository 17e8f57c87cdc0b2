"""resample: Poisson copies at any rate, weighted rates with the effective rate column, rejection sampling."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.core.errors import InputError, SchemaError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.ops import copies
from batchtool.core.options import NumberOrColumn
from batchtool.exec.driver import run_operation
from batchtool.ops.resample import OP, ResampleOptions, RunningMean
from batchtool.ops.copies import piece_bounds, repeat_rows
from batchtool.io.output import OutputOptions
from conftest import read_dir, write_parquet_shards


def run(src, dst, threads: int = 2, seed: int = 0, **options):
    return run_operation(OP, ResampleOptions(**options), src, str(dst), OutputOptions(),
                         RunSettings(threads=threads, quiet=True), seed=seed)


def dataset(path, rows: int, row_group_size: int = 250, **columns) -> str:
    table = pa.table({"key": np.arange(rows), **columns})
    return write_parquet_shards(str(path), table, shards=2, row_group_size=row_group_size)


def copies_per_key(out: pa.Table, rows: int) -> np.ndarray:
    return np.bincount(out.column("key").to_numpy(), minlength=rows)


def test_poisson_copies_have_mean_and_variance_rate_for_small_and_huge_rates(tmp_path):
    """Rates 0.5, 3 and 200 (resample_at_rate's float32 method breaks above 87): mean within 4 standard errors."""
    rates = np.tile([0.5, 3.0, 200.0], 1000)
    src = dataset(tmp_path / "src", len(rates), rate=rates)
    result = run(src, tmp_path / "out", rate="rate")
    copies = copies_per_key(read_dir(str(tmp_path / "out")), len(rates))
    for r in (0.5, 3.0, 200.0):
        c = copies[rates == r]
        assert abs(c.mean() - r) <= 4 * np.sqrt(r / len(c)), (r, c.mean())
        assert c.var() == pytest.approx(r, rel=0.25)  # Poisson: variance = mean
    stats = result.manifest["stats"]
    assert stats["rows_out"] == copies.sum() and stats["rate"]["max"] == 200.0
    assert stats["examples_dropped"] == int((copies == 0).sum())
    assert stats["examples_duplicated"] == int((copies >= 2).sum())


def test_copies_are_consecutive_rows_equal_to_the_input_row_and_rate_zero_drops(tmp_path):
    src = dataset(tmp_path / "src", 40, rate=np.array([0.0, 4.0] * 20), name=[f"n{i}" for i in range(40)])
    run(src, tmp_path / "out", rate="rate")
    out = read_dir(str(tmp_path / "out"))
    keys = out.column("key").to_numpy()
    assert not np.any(keys % 2 == 0)
    assert np.all(np.diff(keys) >= 0)  # input order, copies together
    assert all(r["name"] == f"n{r['key']}" and r["rate"] == 4.0 for r in out.to_pylist())


def test_constant_rate_and_a_rate_column_given_as_text(tmp_path):
    assert NumberOrColumn().from_text("rate", "2.5") == 2.5 and NumberOrColumn().from_text("rate", "r") == "r"
    src = dataset(tmp_path / "src", 2000)
    result = run(src, tmp_path / "out", rate=0.5)
    assert abs(result.rows_out / 2000 - 0.5) <= 4 * np.sqrt(0.5 / 2000)


@pytest.mark.parametrize("value, shown", [(-1.0, "-1.0"), (float("nan"), "nan"), (None, "null"),
                                          (float("inf"), "inf"), (1e10, "10000000000.0")])
def test_bad_rates_name_file_row_and_column(tmp_path, value, shown):
    rates = [1.0] * 10
    rates[7] = value
    src = dataset(tmp_path / "src", 10, rate=pa.array(rates, pa.float64()))
    with pytest.raises(InputError, match=rf"part-00001\.parquet, row 2, column 'rate': rate {shown} "
                                         r"\(expected in \[0, 4294967296\]"):
        run(src, tmp_path / "out", rate="rate")
    assert not (tmp_path / "out").exists()


def test_weighted_mean_rate_and_copies_proportional_to_weight(tmp_path):
    weights = np.tile([1.0, 3.0], 3000)
    src = dataset(tmp_path / "src", len(weights), weight=weights)
    result = run(src, tmp_path / "out", weight="weight", overall_rate=2.0)
    out = read_dir(str(tmp_path / "out"))
    copies = copies_per_key(out, len(weights))
    # mean weight 2: rates 1 and 3, mean rate 2
    assert result.manifest["stats"]["mean_weight"] == 2.0
    assert result.manifest["stats"]["rate"]["mean"] == pytest.approx(2.0)
    assert abs(copies.mean() - 2.0) <= 4 * np.sqrt(2.0 / len(copies))
    low, high = copies[weights == 1].mean(), copies[weights == 3].mean()
    assert abs(high / low - 3.0) <= 4 * 3.0 * np.sqrt(1 / 3000 + 1 / 9000)
    effective = out.column("resample_rate").to_numpy()
    assert np.array_equal(effective, np.where(out.column("weight").to_numpy() == 1.0, 1.0, 3.0))
    assert out.schema.names == ["key", "weight", "resample_rate"]


def test_weighted_errors(tmp_path):
    src = dataset(tmp_path / "src", 10, weight=np.zeros(10))
    with pytest.raises(InputError, match="every weight is 0"):
        run(src, tmp_path / "out", weight="weight", overall_rate=1.0)
    with pytest.raises(UsageError, match="column 'weight' is also an output column of resample; name resample's "
                                         "otherwise with --output-column resample_rate=NEW_NAME"):
        run(src, tmp_path / "out", weight="key", overall_rate=1.0, rate_column="weight")
    with pytest.raises(UsageError, match="--rate-column and --output-column name the same column; give one"):
        run(src, tmp_path / "out", weight="key", overall_rate=1.0, rate_column="r",
            output_column=(("resample_rate", "s"),))
    with pytest.raises(SchemaError, match="no column 'nope'"):
        run(src, tmp_path / "out", weight="nope", overall_rate=1.0)


def test_output_column_names_the_rate_column_when_the_input_has_one(tmp_path):
    src = dataset(tmp_path / "src", 4, weight=np.array([1.0, 1.0, 3.0, 3.0]), resample_rate=np.ones(4))
    with pytest.raises(UsageError, match="column 'resample_rate' is also an output column of resample"):
        run(src, tmp_path / "out", weight="weight", overall_rate=1.0)
    result = run(src, tmp_path / "out", weight="weight", overall_rate=1.0, output_column=(("resample_rate", "rate"),))
    out = read_dir(str(tmp_path / "out"))
    assert out.schema.names == ["key", "weight", "resample_rate", "rate"]
    assert out.column("resample_rate").to_pylist() == [1.0] * out.num_rows
    assert result.manifest["options"]["rate_column"] == "rate"
    assert result.manifest["options"]["output_columns"] == {"resample_rate": "rate"}


def test_running_mean_reproduces_the_seeds_estimate():
    """Chunk means 2, 4, 8, 16 with warmup 2 and decay 0.5: decays 0, 1/2, 1/2, 1/2."""
    chunks = [Chunk(pa.record_batch({"w": [m, m]}), rng.example_ids(0, 2 * i, 2)) for i, m in
              enumerate([2.0, 4.0, 8.0, 16.0])]
    running = RunningMean("w", 0.5, 2, str)
    assert [running.update(c) for c in chunks] == [2.0, 3.0, 5.5, 10.75]
    # during warmup it is the plain mean of the chunk means: d_c = (c - 1) / c
    running = RunningMean("w", 0.999, 10, str)
    plain = [running.update(c) for c in chunks]
    assert plain == pytest.approx([2.0, 3.0, 14 / 3, 7.5])


def test_running_mean_is_deterministic_across_threads(tmp_path):
    src = dataset(tmp_path / "src", 3000, row_group_size=100, weight=np.linspace(0.1, 5.0, 3000))
    for threads in (1, 4):
        run(src, tmp_path / f"t{threads}", threads=threads, weight="weight", overall_rate=1.0, running_mean=True,
            mean_decay=0.9, warmup=3)
    assert read_dir(str(tmp_path / "t1")).equals(read_dir(str(tmp_path / "t4")))


def test_accept_prob_rejection_sampling_within_binomial_error(tmp_path):
    probs = np.tile([0.1, 0.9], 2000)
    src = dataset(tmp_path / "src", len(probs), p=probs, keep=np.tile([True, False], 2000))
    run(src, tmp_path / "out", accept_prob="p")
    copies = copies_per_key(read_dir(str(tmp_path / "out")), len(probs))
    assert copies.max() == 1
    for p in (0.1, 0.9):
        c = copies[probs == p]
        assert abs(c.mean() - p) <= 4 * np.sqrt(p * (1 - p) / len(c))
    run(src, tmp_path / "bool", accept_prob="keep")  # a boolean column is a probability of 0 or 1
    assert read_dir(str(tmp_path / "bool")).column("keep").to_pylist() == [True] * 2000


def test_accept_prob_outside_unit_interval_is_an_error(tmp_path):
    src = dataset(tmp_path / "src", 6, p=[0.5, 0.5, 1.5, 0.5, 0.5, 0.5])
    with pytest.raises(InputError, match=r"row 2, column 'p': acceptance probability 1.5 \(expected in \[0, 1\]"):
        run(src, tmp_path / "out", accept_prob="p")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give exactly one of --rate"),
    ({"rate": 1.0, "accept_prob": "p"}, r"got --rate, --accept-prob"),
    ({"rate": -2.0}, "--rate -2.0: must be a finite rate >= 0"),
    ({"rate": 1e308}, r"--rate 1e\+308: must be a finite rate >= 0 and at most 4294967296 \(expected copies"),
    ({"weight": "w", "overall_rate": 1e12}, r"--overall-rate 1000000000000.0: must be a finite rate >= 0 and at "
                                            "most 4294967296"),
    ({"weight": "w"}, "--weight and --overall-rate go together"),
    ({"rate": 1.0, "running_mean": True}, "--running-mean applies to --weight"),
    ({"weight": "w", "overall_rate": 1.0, "mean_decay": 1.0}, r"--mean-decay 1.0: must be in \[0, 1\)"),
    ({"weight": "w", "overall_rate": 1.0, "warmup": 0}, "--warmup 0"),
])
def test_option_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ResampleOptions(**kwargs)


def test_repeat_rows_gives_copies_distinct_ids_and_keeps_the_first():
    chunk = Chunk(pa.record_batch({"x": [10, 20, 30]}), rng.example_ids(0, 0, 3))
    out = repeat_rows(chunk, np.array([3, 0, 2]), seed=1, stage="t")
    assert out.data.column("x").to_pylist() == [10, 10, 10, 30, 30]
    assert out.ids[0] == chunk.ids[0] and out.ids[3] == chunk.ids[2]
    assert len(set(out.ids.tolist())) == 5
    assert repeat_rows(chunk, np.ones(3, dtype=np.int64), 1, "t") is chunk


@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.data())
def test_a_range_of_the_copies_is_that_slice_of_all_of_them(copies, data):
    """Pieces are cut anywhere, even inside one row's copies: rows and ids are those of the whole output."""
    copies = np.array(copies)
    chunk = Chunk(pa.record_batch({"x": np.arange(len(copies))}), rng.example_ids(1, 5, len(copies)))
    whole = repeat_rows(chunk, copies, seed=2, stage="t")
    start = data.draw(st.integers(0, int(copies.sum())))
    stop = data.draw(st.integers(start, int(copies.sum())))
    part = repeat_rows(chunk, copies, seed=2, stage="t", start=start, stop=stop)
    assert part.data.column("x").to_pylist() == whole.data.column("x").to_pylist()[start:stop]
    assert part.ids.tolist() == whole.ids.tolist()[start:stop]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.lists(st.floats(0.0, 300.0), min_size=12,
                                                                        max_size=12), st.floats(1.0, 2000.0))
def test_piece_bounds_cover_the_output_in_order_within_the_limit(copies, sizes, limit):
    sizes = np.array(sizes[:len(copies)])
    bounds = piece_bounds(np.array(copies), sizes, limit)
    assert bounds[0][0] == 0 and bounds[-1][1] == sum(copies)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    per_row = np.repeat(np.maximum(sizes, 1.0), copies)
    for start, stop in bounds:
        assert stop - start == 1 or per_row[start:stop].sum() <= limit


def test_an_outlier_rate_is_written_in_pieces_with_every_copy(tmp_path, monkeypatch):
    """One row with a huge rate: its copies are cut into row groups of about PIECE_BYTES, none lost."""
    monkeypatch.setattr(copies, "PIECE_BYTES", 20_000)
    rates = np.zeros(50)
    rates[17] = 3000.0
    src = dataset(tmp_path / "src", 50, rate=rates)
    result = run(src, tmp_path / "out", rate="rate")
    files = sorted((tmp_path / "out").glob("part-*"))
    groups = [pq.ParquetFile(f).metadata.row_group(i) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]
    assert len(groups) >= 3 and all(g.num_rows > 1 for g in groups)  # 16-byte rows: 1,250 per piece
    out = read_dir(str(tmp_path / "out"))
    assert out.num_rows == result.rows_out == result.manifest["stats"]["copies_per_example"]["max"]
    assert set(out.column("key").to_pylist()) == {17}


def test_weighted_pieces_carry_the_rate_of_their_row(tmp_path, monkeypatch):
    monkeypatch.setattr(copies, "PIECE_BYTES", 20_000)
    weights = np.full(50, 0.001)
    weights[3] = 40.0
    src = dataset(tmp_path / "src", 50, w=weights)
    run(src, tmp_path / "out", weight="w", overall_rate=50.0)
    out = read_dir(str(tmp_path / "out"))
    rates = dict(zip(out.column("key").to_pylist(), out.column("resample_rate").to_pylist()))
    assert out.num_rows > 1000 and rates[3] == pytest.approx(50.0 * 40.0 / weights.mean())


def test_a_weight_whose_rate_is_too_large_names_its_row(tmp_path):
    weights = np.zeros(20)
    weights[11] = 1.0
    src = dataset(tmp_path / "src", 20, w=weights)
    with pytest.raises(InputError, match=r"part-00001\.parquet, row 1, column 'w': weight 1 gives rate 8e\+09 "
                                         r"\(--overall-rate 4e\+08 x weight / mean weight 0\.05\), more than "
                                         r"4294967296 copies of one example"):
        run(src, tmp_path / "out", weight="w", overall_rate=4e8)
    assert not (tmp_path / "out").exists()


def test_seeds_differ_and_threads_do_not_matter(tmp_path):
    src = dataset(tmp_path / "src", 2000, row_group_size=100, w=np.linspace(0.0, 2.0, 2000))
    for name, threads, seed in (("t1", 1, 0), ("t4", 4, 0), ("s1", 2, 1)):
        run(src, tmp_path / name, threads=threads, seed=seed, weight="w", overall_rate=1.5)
    t1, t4, s1 = (read_dir(str(tmp_path / n)) for n in ("t1", "t4", "s1"))
    assert t1.equals(t4) and not t1.equals(s1)
