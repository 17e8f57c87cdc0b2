"""bucket as a library: batch budgets, every example once, padding, dropped counts, order and determinism."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.errors import InputError, SchemaError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.base import Context, OptionError
from batchtool.core.options import ColumnList, fields
from batchtool.ops.bucket import OP, BucketOptions
from batchtool.ops.bucket.options import Integers
from batchtool.ops.bucket.plan import BucketPlan, LengthPass, resolve_columns
from batchtool.ops.batching import BatchBudget
from batchtool.io.stats import DatasetStats
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table
from conftest import data_bytes, read_dir, write_parquet_shards

QUIET = RunSettings(threads=2, quiet=True)


def run(tmp_path, table: pa.Table, name: str = "out", run: RunSettings = QUIET, seed: int = 0,
        memory: int | None = None, **options) -> tuple[pa.Table, dict]:
    src = str(tmp_path / "src")
    if not os.path.exists(src):
        write_parquet_shards(src, table, shards=3, row_group_size=40)
    result = run_operation(OP, BucketOptions(**options), src, str(tmp_path / name), OutputOptions(),
                           replace(run, memory=memory), seed=seed)
    return read_dir(str(tmp_path / name)), result.manifest


def batches_of(out: pa.Table) -> list[pa.Table]:
    ids = out.column("batch").to_numpy()
    if not len(ids):
        return []
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return [out.slice(s, e - s) for s, e in zip(starts, np.r_[starts[1:], len(ids)])]


# --- the batch budget on its own -------------------------------------------------------------------------

@given(st.lists(st.lists(st.integers(0, 50), max_size=20), max_size=6), st.integers(50, 400),
       st.one_of(st.none(), st.integers(1, 12)), st.one_of(st.none(), st.integers(0, 50)))
@settings(max_examples=300, deadline=None)
def test_max_tokens_is_never_exceeded_and_batches_are_greedy(blocks, max_tokens, max_rows, pad_to):
    budget = BatchBudget(max_tokens=max_tokens, max_rows=max_rows)
    lengths = [x for block in blocks for x in block]
    sizes = budget.cut([np.array(b, dtype=np.int64) for b in blocks], pad_to)
    assert sizes.sum() == len(lengths) and (sizes > 0).all()
    start = 0
    for i, size in enumerate(sizes.tolist()):
        rows = lengths[start:start + size]
        width = pad_to if pad_to is not None else max(rows)
        assert size * max(width, 1) <= max_tokens and (max_rows is None or size <= max_rows)
        if i + 1 < len(sizes):  # it closed because the next row did not fit
            nxt = lengths[start + size]
            assert not budget.fits(size + 1, pad_to if pad_to is not None else max(width, nxt))
        start += size


def test_batch_size_cuts_full_batches_and_a_remainder():
    budget = BatchBudget(batch_size=4)
    assert budget.cut([np.arange(6), np.arange(5)]).tolist() == [4, 4, 3]
    assert budget.is_partial(3) and not budget.is_partial(4)
    assert BatchBudget(max_tokens=10).is_partial(1)


# --- end to end on small data ----------------------------------------------------------------------------

@pytest.fixture
def table() -> pa.Table:
    t = make_table(400, seed=11)
    keep = pa.array(np.random.default_rng(1).random(400) < 0.8)
    return t.append_column("keep", keep)


def test_every_example_once_padded_to_one_length_with_true_lengths(tmp_path, table):
    out, manifest = run(tmp_path, table, boundaries=(20, 40, 80), batch_size=(16,), pad_value=("tokens=-7",),
                        mask=True)
    assert sorted(out.column("key").to_pylist()) == sorted(table.column("key").to_pylist())
    original = {k: t for k, t in zip(table.column("key").to_pylist(), table.column("tokens").to_pylist())}
    for batch in batches_of(out):
        tokens, lengths = batch.column("tokens").to_pylist(), batch.column("length").to_pylist()
        width = max(lengths)
        assert {len(t) for t in tokens} == {width}
        assert {len(f) for f in batch.column("frames").to_pylist()} == {width}
        assert len(set(batch.column("bucket").to_pylist())) == 1 and batch.num_rows <= 16
        for key, row, n, m in zip(batch.column("key").to_pylist(), tokens, lengths,
                                  batch.column("mask").to_pylist()):
            assert row[:n] == original[key] and row[n:] == [-7] * (width - n)
            assert m == [True] * n + [False] * (width - n)
    bucket_of = np.searchsorted([20, 40, 80], out.column("length").to_numpy(), side="right")
    assert (bucket_of == out.column("bucket").to_numpy()).all()
    stats = manifest["stats"]
    assert stats["rows_in"] == manifest["output"]["rows"] == 400
    assert stats["examples_dropped"] == {"keep": 0, "oversize": 0, "remainder": 0}


def test_one_row_group_per_batch_and_stats_match_the_output(tmp_path, table):
    out, manifest = run(tmp_path, table, auto_buckets=4, batch_size=(10,))
    files = sorted(f for f in os.listdir(tmp_path / "out") if f.endswith(".parquet"))
    groups = [pq.ParquetFile(tmp_path / "out" / f).read_row_group(i)
              for f in files for i in range(pq.ParquetFile(tmp_path / "out" / f).num_row_groups)]
    assert [g.num_rows for g in groups] == [b.num_rows for b in batches_of(out)]
    assert out.column("batch").to_pylist() == sorted(out.column("batch").to_pylist())
    stats = manifest["stats"]
    for row in stats["buckets"]:
        mine = [b for b in batches_of(out) if b.column("bucket")[0].as_py() == row["bucket"]]
        assert row["batches"] == len(mine) and row["examples"] == sum(b.num_rows for b in mine)
        assert row["real_elements"] == sum(sum(b.column("length").to_pylist()) for b in mine)
        assert row["padded_elements"] == sum(b.num_rows * max(b.column("length").to_pylist()) for b in mine)
    assert stats["padding_efficiency"] == round(stats["real_elements"] / stats["padded_elements"], 6)
    assert 0 < stats["auto_buckets"]["quantile_expected_padding_efficiency"] \
        <= stats["auto_buckets"]["expected_padding_efficiency"] <= stats["padding_efficiency"]


def test_keep_and_drop_remainder_are_counted(tmp_path, table):
    out, manifest = run(tmp_path, table, boundaries=(30,), batch_size=(16,), keep="keep", drop_remainder=True)
    dropped = manifest["stats"]["examples_dropped"]
    kept = table.filter(table.column("keep"))
    assert dropped["keep"] == 400 - kept.num_rows
    assert set(out.column("key").to_pylist()) <= set(kept.column("key").to_pylist())
    assert out.num_rows + dropped["remainder"] == kept.num_rows
    assert {b.num_rows for b in batches_of(out)} == {16}
    lengths = np.array([len(t) for t in kept.column("tokens").to_pylist()])
    assert dropped["remainder"] == (lengths < 30).sum() % 16 + (lengths >= 30).sum() % 16


def test_max_tokens_batches_and_oversize(tmp_path, table):
    longest = max(len(t) for t in table.column("tokens").to_pylist())
    with pytest.raises(InputError, match=r"part-\d+\.parquet, row \d+: an example of length \d+ .*--max-tokens 150"):
        run(tmp_path, table, boundaries=(20, 40), max_tokens=150)
    assert not os.path.exists(tmp_path / "out")
    out, manifest = run(tmp_path, table, boundaries=(20, 40), max_tokens=150, max_rows=8, drop_oversize=True)
    for batch in batches_of(out):
        assert batch.num_rows * max(batch.column("length").to_pylist()) <= 150 and batch.num_rows <= 8
    over = sum(len(t) > 150 for t in table.column("tokens").to_pylist())
    assert over and longest > 150
    assert manifest["stats"]["examples_dropped"]["oversize"] == over == 400 - out.num_rows


def test_pad_to_boundary_pads_to_the_longest_length_a_bucket_admits(tmp_path, table):
    out, _ = run(tmp_path, table, boundaries=(20, 40), batch_size=(8,), pad_to_boundary=True)
    for batch in batches_of(out):
        width = {len(t) for t in batch.column("tokens").to_pylist()}
        b = batch.column("bucket")[0].as_py()
        assert width == ({19}, {39}, {max(batch.column("length").to_pylist())})[b]


def test_per_bucket_batch_sizes(tmp_path, table):
    out, _ = run(tmp_path, table, boundaries=(20, 40), batch_size=(12, 6, 3))
    for batch in batches_of(out):
        assert batch.num_rows <= (12, 6, 3)[batch.column("bucket")[0].as_py()]


def test_bucket_column(tmp_path, table):
    out, manifest = run(tmp_path, table, bucket_column="label", num_buckets=4, batch_size=(5,))
    for batch in batches_of(out):
        assert set(batch.column("label").to_pylist()) == set(batch.column("bucket").to_pylist())
    assert "lengths" not in manifest["stats"]["buckets"][0]
    with pytest.raises(InputError, match=r"row \d+, column 'label': bucket [123] is outside \[0, 1\)"):
        run(tmp_path, table, name="bad", bucket_column="label", num_buckets=1, batch_size=(5,))


def test_batches_from_all_buckets_are_interleaved(tmp_path, table):
    out, _ = run(tmp_path, table, boundaries=(25, 50), batch_size=(4,))
    order = [b.column("bucket")[0].as_py() for b in batches_of(out)]
    assert order != sorted(order)
    assert sum(x != y for x, y in itertools.pairwise(order)) > len(order) / 4


def test_sorted_order_is_ascending_length(tmp_path, table):
    out, _ = run(tmp_path, table, auto_buckets=3, batch_size=(7,), order="sorted", memory=20_000)
    lengths = out.column("length").to_numpy()
    assert (np.diff(lengths) >= 0).all()
    assert sorted(out.column("key").to_pylist()) == sorted(table.column("key").to_pylist())


@pytest.mark.parametrize("options", [
    {"boundaries": (20, 40), "batch_size": (16,)},
    {"auto_buckets": 4, "max_tokens": 300, "drop_oversize": True, "mask": True},
])
def test_same_bytes_for_any_threads_and_a_different_seed_differs(tmp_path, table, options):
    small = dict(options, memory=50_000)  # forces several spill parts per bucket
    outs = [run(tmp_path, table, name=f"t{t}", run=RunSettings(threads=t, quiet=True), **small)[0]
            for t in (1, 4)]
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t4"))
    keys = outs[0].column("key").to_pylist()
    assert len(set(keys)) == len(keys) and set(keys) <= set(table.column("key").to_pylist())
    run(tmp_path, table, name="s1", seed=1, **small)
    assert data_bytes(str(tmp_path / "s1")) != data_bytes(str(tmp_path / "t1"))


def test_integer_length_column_must_agree_with_sequences(tmp_path, table):
    n = pa.array([len(t) for t in table.column("tokens").to_pylist()], pa.int32())
    good = table.append_column("n", n)
    out, _ = run(tmp_path, good, length="n", boundaries=(30,), batch_size=(9,))
    assert out.column("n").to_pylist() == out.column("length").to_pylist()
    bad = table.append_column("n", pa.compute.add(n, pa.scalar(1, pa.int32())))
    with pytest.raises(SchemaError, match=r"row 0: column 'n' says length \d+ but sequence column 'tokens' has"):
        run(tmp_path / "b", bad, length="n", boundaries=(30,), batch_size=(9,))


def test_option_errors():
    with pytest.raises(UsageError, match="exactly one of --boundaries, --auto-buckets, --bucket-column"):
        BucketOptions(batch_size=(4,))
    with pytest.raises(UsageError, match="exactly one of --batch-size and --max-tokens"):
        BucketOptions(boundaries=(4,), batch_size=(4,), max_tokens=100)
    with pytest.raises(UsageError, match="3 sizes for 2 buckets"):
        BucketOptions(boundaries=(4,), batch_size=(4, 5, 6))
    with pytest.raises(UsageError, match="--max-rows goes with --max-tokens"):
        BucketOptions(boundaries=(4,), batch_size=(4,), max_rows=3)
    with pytest.raises(UsageError, match="--pad-to-boundary needs length buckets"):
        BucketOptions(bucket_column="label", num_buckets=2, batch_size=(4,), pad_to_boundary=True)
    with pytest.raises(UsageError, match="--bucket-column and --num-buckets go together"):
        BucketOptions(bucket_column="label", batch_size=(4,))


@given(st.lists(st.integers(0, 30), min_size=1, max_size=60), st.data())
@settings(max_examples=25, deadline=None)
def test_property_every_example_once_or_counted_and_budgets_hold(tmp_path_factory, lengths, data):
    n = len(lengths)
    keep = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    boundaries = tuple(data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=4, unique=True).map(sorted)))
    batching = data.draw(st.one_of(st.builds(lambda b: {"batch_size": (b,)}, st.integers(1, 7)),
                                   st.builds(lambda t: {"max_tokens": t, "drop_oversize": True},
                                             st.integers(1, 60))))
    drop_remainder = data.draw(st.booleans())
    table = pa.table({"key": [f"k{i}" for i in range(n)], "keep": keep,
                      "tokens": pa.array([list(range(1, x + 1)) for x in lengths], pa.list_(pa.int32()))})
    out, manifest = run(tmp_path_factory.mktemp("p"), table, boundaries=boundaries, keep="keep",
                        drop_remainder=drop_remainder, pad_value=("tokens=-1",), **batching)
    dropped = manifest["stats"]["examples_dropped"]
    keys = out.column("key").to_pylist()
    assert len(set(keys)) == len(keys) and out.num_rows + sum(dropped.values()) == n
    assert dropped["keep"] == keep.count(False)
    for batch in batches_of(out):
        rows = batch.column("tokens").to_pylist()
        true = batch.column("length").to_pylist()
        width = max(true)
        assert all(r == list(range(1, t + 1)) + [-1] * (width - t) for r, t in zip(rows, true))
        if "max_tokens" in batching:
            assert batch.num_rows * max(width, 1) <= batching["max_tokens"]
        else:
            assert batch.num_rows <= batching["batch_size"][0]
    assert all(lengths[int(k[1:])] == t for k, t in zip(keys, out.column("length").to_pylist()))


# --- the option schema: values from a pipeline file, problems in each front end's words -------------------------

@pytest.mark.parametrize("options, cli, toml", [
    ({"boundaries": (4,), "bucket_column": "label", "num_buckets": 2, "batch_size": (4,)},
     "give exactly one of --boundaries, --auto-buckets, --bucket-column (got --boundaries and --bucket-column)",
     "give exactly one of boundaries, auto-buckets, bucket-column (got boundaries and bucket-column)"),
    ({"boundaries": (10, 5), "batch_size": (4,)},
     "--boundaries 10,5: boundaries must be strictly increasing (10 is followed by 5)",
     "key 'boundaries' = 10,5: boundaries must be strictly increasing (10 is followed by 5)"),
    ({"bucket_column": "b", "num_buckets": 0, "batch_size": (4,)},
     "--num-buckets 0: must be at least 1", "key 'num-buckets' = 0: must be at least 1"),
    ({"boundaries": (4,), "batch_size": (4,), "order": "random"},
     "--order 'random': expected shuffle or sorted", "key 'order' = 'random': expected shuffle or sorted"),
    ({"boundaries": (4,), "batch_size": (4,), "output_column": (("length", "n"), ("length", "m"))},
     "--output-column: length named twice", "key 'output-column': length named twice"),
    ({"boundaries": (4,), "batch_size": (4,), "balance": "label", "target": "even"},
     "--target 'even': expected 'uniform', P0,P1,... or CLASS=PROB pairs",
     "key 'target' = 'even': expected 'uniform', P0,P1,... or CLASS=PROB pairs"),
    ({"boundaries": (4,), "max_tokens": 0}, "--max-tokens 0: must be positive", "key 'max-tokens' = 0: must be positive"),
    ({"boundaries": (4,), "batch_size": (4,), "cost": "cubic"},
     "--cost 'cubic': expected linear or quadratic", "key 'cost' = 'cubic': expected linear or quadratic"),
    ({"boundaries": (4,), "batch_size": (0,)},
     "--batch-size 0: batch sizes must be positive", "key 'batch-size' = 0: batch sizes must be positive"),
    ({"auto_buckets": 2, "batch_size": (4, 8)},
     "--batch-size 4,8: one size per bucket needs fixed buckets (--boundaries or --bucket-column); --auto-buckets "
     "takes one size",
     "key 'batch-size' = 4,8: one size per bucket needs fixed buckets (boundaries or bucket-column); auto-buckets "
     "takes one size"),
    ({"boundaries": (4,), "batch_size": (4,), "oversample": True},
     "--oversample goes with --balance LABEL_COLUMN", "oversample goes with balance LABEL_COLUMN"),
])
def test_option_problems_name_the_option_as_each_front_end_does(options, cli, toml):
    with pytest.raises(OptionError) as caught:
        BucketOptions(**options)
    assert (caught.value.rendered("cli"), caught.value.rendered("toml")) == (cli, toml)


def test_pipeline_values_take_the_command_lines_forms():
    assert Integers().parse("boundaries", 16) == (16,)
    assert Integers().parse("boundaries", [8, 16]) == Integers().parse("boundaries", "8, 16") == (8, 16)
    with pytest.raises(OptionError, match="expected comma-separated integers, got boolean True"):
        Integers().parse("batch_size", True)
    with pytest.raises(OptionError) as caught:
        Integers().parse("boundaries", "a")
    assert caught.value.rendered("cli") == "--boundaries 'a': expected comma-separated integers, e.g. 64,128,256"
    kinds = {f.name: decl.value for f, decl in fields(BucketOptions)}
    pads = kinds["pad_value"]
    assert pads.parse("pad_value", {"tokens": -1, "frames": 0.5}) == ("tokens=-1", "frames=0.5")
    assert pads.parse("pad_value", "tokens=-1") == ("tokens=-1",)
    with pytest.raises(OptionError, match=r"expected COL=V pairs, got list \[\['x'\]\]"):
        pads.parse("pad_value", [["x"]])
    names = kinds["output_column"]
    assert names.parse("output_column", {"length": "n"}) == (("length", "n"),)
    assert names.parse("output_column", ["length=n, mask=m"]) == (("length", "n"), ("mask", "m"))
    assert ColumnList(dedupe=True).parse("sequence", ["tokens,frames", "tokens"]) == ("tokens", "frames")


# --- the plan and the dry run, from a length histogram alone --------------------------------------------------

SCHEMA = pa.schema([("tokens", pa.list_(pa.int64()))])


def planned(**options) -> BucketPlan:
    """The plan for 10 rows of length 5 and 20 of length 25."""
    counts = np.zeros(26, dtype=np.int64)
    counts[5], counts[25] = 10, 20
    first = LengthPass(DatasetStats(rows=30, length_counts=counts))
    return OP.plan(BucketOptions(**options), Context(0, SCHEMA, "src", str), first)


@pytest.mark.parametrize("options, rows_out, batches", [
    ({"batch_size": (4,)}, 30, 3 + 5),
    ({"batch_size": (4,), "drop_remainder": True}, 8 + 20, 2 + 5),
    ({"max_tokens": 100}, 30, None),  # every row is written; how many batches depends on the order
    ({"max_tokens": 100, "drop_remainder": True}, None, None),
])
def test_dry_run_plans_rows_and_batches_from_the_first_pass(options, rows_out, batches):
    rows, info = OP.expected(planned(boundaries=(10,), **options), 30)
    expected = {"boundaries": [10], "num_buckets": 2, "examples_per_bucket": [10, 20], "padding_efficiency": 1.0}
    assert (rows, info) == (rows_out, expected if batches is None else {**expected, "batches": batches})


def test_a_budget_of_rows_fits_any_length_and_a_corpus_needs_something_to_measure():
    assert BatchBudget(batch_size=4).fits(4, 10**6) and not BatchBudget(batch_size=4).fits(5, 1)
    with pytest.raises(SchemaError, match="no list column to measure: pass --length"):
        resolve_columns(BucketOptions(boundaries=(4,), batch_size=(4,)), pa.schema([("n", pa.int64())]))


# --- columns that are not lengths ----------------------------------------------------------------------------

def small(bucket_of: list[int], labels: list[int]) -> pa.Table:
    n = len(labels)
    return pa.table({"key": [f"k{i}" for i in range(n)], "label": pa.array(labels, pa.int64()),
                     "b": pa.array(bucket_of, pa.int64()),
                     "tokens": pa.array([[1] * (i % 3 + 1) for i in range(n)], pa.list_(pa.int64()))})


def test_balance_with_a_bucket_column_puts_one_of_each_class_in_every_batch(tmp_path):
    table = small([0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0, 1, 0])
    out, manifest = run(tmp_path, table, bucket_column="b", num_buckets=2, batch_size=(2,), balance="label")
    parts = batches_of(out)
    assert len(parts) == 4 and all(sorted(b.column("label").to_pylist()) == [0, 1] for b in parts)
    assert out.column("b").to_pylist() == out.column("bucket").to_pylist()
    assert manifest["stats"]["balance"]["class_rows_out"] == [4, 4]


def test_an_input_bucket_column_is_written_once_when_it_holds_the_buckets(tmp_path):
    table = small([0] * 6, [0] * 6)
    lengths = [len(t) for t in table.column("tokens").to_pylist()]
    right = table.append_column("bucket", pa.array([int(x >= 2) for x in lengths], pa.int64()))
    out, _ = run(tmp_path / "right", right, boundaries=(2,), batch_size=(3,))
    assert out.schema.names.count("bucket") == 1
    wrong = table.append_column("bucket", pa.array([0] * 6, pa.int64()))
    with pytest.raises(SchemaError, match=r"column 'bucket': 0 but its bucket is 1; bucket writes its own 'bucket'"):
        run(tmp_path / "wrong", wrong, boundaries=(2,), batch_size=(3,))
