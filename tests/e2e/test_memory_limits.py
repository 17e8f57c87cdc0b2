"""Options and values that multiply memory: each streams within the cap or stops before allocating.

The cases run in a child process under a hard RSS cap (tests/memlimit.py), so a regression fails here
instead of taking the machine down: one child runs them one after another (its interpreter start-up is
most of the cost) and names the case it was running if it dies. A case that must stop ends in exit
status 2 and one `error:` line naming the option or the row; a case whose output is legitimately
large (many copies of a row, long segments) must finish, and each of those took more than the cap
before (peak RSS by /usr/bin/time -v, run alone: 397, 494 and 460 MiB before; 258, 270 and 248 MiB now).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import memlimit
from batchtool.core import budget
from batchtool.core.budget import DEFAULT_MEMORY
from batchtool.core.errors import InputError, OptionInputError, UsageError
from batchtool.io.dataset import Chunk
from batchtool.ops.segment import op as segment_op
from batchtool.ops import shuffle as shuffle_op
from batchtool.ops.bucket import BucketOptions
from batchtool.ops.bucket.plan import LengthPass, make_plan, resolve_columns, with_spill_layout
from batchtool.ops.quotas import plan_layout
from batchtool.ops.segment.options import SegmentOptions
from batchtool.ops.stratify import StratifyOptions
from batchtool.io.stats import DatasetStats
from conftest import SAMPLE, read_dir

CAP = 360 << 20
"""Above the ~250 MB the streaming cases take (an interpreter with pyarrow is ~120 MB of it)."""
PARQUET = os.path.join(SAMPLE, "parquet")
SEGMENT = ["--key", "key", "--sequence", "tokens"]

STOPS = {
    "resample --rate 1e308": (["resample", PARQUET, "{out}", "--rate", "1e308"],
                              "--rate 1e+308: must be a finite rate >= 0 and at most 4294967296"),
    "resample --weight, one weight too heavy": (
        ["resample", "{outlier}", "{out}", "--weight", "w", "--overall-rate", "4e8"],
        "outlier/part-0.parquet, row 7, column 'w': weight 1e+06 gives rate"),
    "segment --num-unroll 1e9": (["segment", PARQUET, "{out}", *SEGMENT, "--num-unroll", "1000000000",
                                  "--batch-size", "32"], "--num-unroll 1000000000 with --batch-size 32: one batch"),
    "segment --batch-size 1e8": (["segment", PARQUET, "{out}", *SEGMENT, "--num-unroll", "10",
                                  "--batch-size", "100000000"], "--num-unroll 10 with --batch-size 100000000"),
    "segment --world-size 1e8": (["segment", PARQUET, "{out}", *SEGMENT, "--num-unroll", "10", "--batch-size", "4",
                                  "--world-size", "100000000"],
                                 "--num-unroll 10 with --batch-size 4 and --world-size 100000000: one batch of 4 "
                                 "segments for each rank (400,000,000 in all) padded to 10 steps"),
    "pack --pad-to-max-length, L 4M, batch 64": (
        ["pack", PARQUET, "{out}", "--max-length", "4194304", "--pad-to-max-length", "--max-examples-per-row", "1",
         "--batch-size", "64"], "--batch-size 64: one batch of 64 rows padded to --max-length 4,194,304 steps "
                                "(--pad-to-max-length) takes about"),
    "pack --pad-to-max-length, L 4M, batch 8": (
        ["pack", PARQUET, "{out}", "--max-length", "4194304", "--pad-to-max-length", "--max-examples-per-row", "1",
         "--batch-size", "8"], "--batch-size 8: one batch of 8 rows padded to --max-length 4,194,304 steps"),
    "pack --pad-to-max-length, L 1e6, --memory 64MB": (
        ["pack", PARQUET, "{out}", "--max-length", "1000000", "--pad-to-max-length", "--max-examples-per-row", "1",
         "--batch-size", "4", "--memory", "64MB"],
        "one batch of 4 rows padded to --max-length 1,000,000 steps (--pad-to-max-length) takes about 231.5 MB at "
        "once, more than --memory 64.0 MB allows (64.0 MB); give a smaller --batch-size or --max-length, drop "
        "--pad-to-max-length, or a larger --memory"),
    "bucket --pad-to-boundary, boundary 1e8": (
        ["bucket", PARQUET, "{out}", "--length", "tokens", "--boundaries", "100000000", "--pad-to-boundary",
         "--batch-size", "4"], "(--pad-to-boundary, boundary 100000000)"),
    "bucket --num-buckets 1e9": (["bucket", PARQUET, "{out}", "--bucket-column", "label", "--num-buckets",
                                  "1000000000", "--batch-size", "4"],
                                 "--num-buckets 1000000000: the bookkeeping of 1,000,000,000 buckets"),
    "bucket --length, a length of 1e12": (["bucket", "{outlier}", "{out}", "--length", "n", "--boundaries", "10",
                                           "--batch-size", "4"], "outlier/part-0.parquet, row 7, column 'n': a length of"),
    "check --length, a length of 1e12": (["check", "{outlier}", "--length", "n", "--max-length", "5"],
                                         "outlier/part-0.parquet, row 7, column 'n': a length of 1,000,000,000,000: "
                                         "counting lengths up to it takes 40,000,000,000,040 bytes, more than --memory"),
    "stratify --replacement --size 1e18": (["stratify", PARQUET, "{out}", "--target", "uniform", "--replacement",
                                            "--size", str(10 ** 18)],
                                           f"--size {10 ** 18:,} with --replacement: each of the 41 examples of "
                                           "class 3 would be written about 6.098e+15 times"),
    "stratify --num-classes 1e9": (["stratify", PARQUET, "{out}", "--target", "uniform", "--num-classes",
                                    "1000000000"], "--num-classes: 1,000,000,000 classes; at most 65,536"),
    "stratify --batch-size 1e9": (["stratify", PARQUET, "{out}", "--target", "uniform", "--mode", "bernoulli",
                                   "--replacement", "--batch-size", "1000000000"],
                                  "--batch-size 1000000000: one batch of 1,000,000,000 rows"),
    "shuffle --buffer 1e9, TFRecord input": (["shuffle", os.path.join(SAMPLE, "tfrecord"), "{out}", "--buffer",
                                              "1000000000", "--memory", "1MB"], "--buffer 1000000000: a buffer of"),
}

STREAMS = {
    "resample: one row (10 KB) with rate 10,000": ["resample", "{rated}", "{rated_out}", "--rate", "r"],
    "stratify --replacement --size 400,000 (class 3: 41 examples x 2,439)": [
        "stratify", PARQUET, "{strat_out}", "--target", "uniform", "--replacement", "--size", "400000"],
    "segment --num-unroll 10,000": ["segment", PARQUET, "{seg_out}", *SEGMENT, "--num-unroll", "10000",
                                    "--batch-size", "32"],
    "pack --split-long: one example of 2,000,000 steps in 1,954 pieces": [
        "pack", "{long}", "{pack_out}", "--sequence", "tokens", "--max-length", "1024", "--split-long",
        "--batch-size", "8"],
}

@pytest.fixture(scope="module")
def capped_runs(tmp_path_factory) -> tuple[dict[str, str], dict[str, memlimit.CliCase]]:
    """Every case of STOPS then STREAMS in one capped child: the paths used and each case's outcome.

    `outlier`: 20 rows, row 7 with a weight of 1e6 (the others 0) and a length column of 1e12; `rated`: 200
    rows of 2,500 float32 steps, row 7 with rate 10,000 (the others 1); `long`: one example of 2,000,000 int32
    steps and one of 2."""
    root = tmp_path_factory.mktemp("limits")
    paths = {name: str(root / name)
             for name in ("outlier", "rated", "long", "out", "rated_out", "strat_out", "seg_out", "pack_out")}
    w, n = np.zeros(20), np.arange(20)
    w[7], n[7] = 1e6, 10 ** 12
    os.makedirs(paths["outlier"])
    pq.write_table(pa.table({"w": w, "n": n}), os.path.join(paths["outlier"], "part-0.parquet"))
    rows, steps = 200, 2500
    frames = pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * steps),
                                      pa.array(np.random.default_rng(0).standard_normal(rows * steps, np.float32)))
    rate = np.ones(rows)
    rate[7] = 10_000
    os.makedirs(paths["rated"])
    pq.write_table(pa.table({"key": np.arange(rows), "frames": frames, "r": rate}),
                   os.path.join(paths["rated"], "part-0.parquet"))
    os.makedirs(paths["long"])  # each piece of it once held the whole example: 1,954 x 8 MB
    pq.write_table(pa.table({"key": ["long", "short"], "tokens": [np.arange(2_000_000, dtype=np.int32), [1, 2]]}),
                   os.path.join(paths["long"], "part-0.parquet"))
    cases = {**{name: args for name, (args, _) in STOPS.items()}, **STREAMS}
    return paths, memlimit.cli_cases({name: [a.format(**paths) for a in args] + ["-q"] for name, args in cases.items()},
                                     CAP)


@pytest.mark.parametrize("name", list(STOPS))
def test_options_and_values_that_multiply_memory_stop_before_allocating(capped_runs, name):
    paths, results = capped_runs
    result = results[name]
    assert result.crash is None, result.crash
    lines = result.stderr.splitlines()
    assert result.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result
    assert STOPS[name][1] in lines[0]
    assert not os.path.exists(paths["out"])


@pytest.mark.parametrize("name", list(STREAMS))
def test_legitimately_large_output_streams_under_the_cap(capped_runs, name):
    paths, results = capped_runs
    assert results[name].code == 0 and results[name].crash is None, results[name]


def test_a_long_example_split_by_pack_is_every_step_once(capped_runs):
    paths, _ = capped_runs
    packed = read_dir(paths["pack_out"])
    steps = np.concatenate([np.asarray(row[:n]) for row, n in zip(packed.column("tokens").to_pylist(),
                                                                   packed.column("length").to_pylist())])
    assert np.sort(steps).tolist() == sorted([*range(2_000_000), 1, 2])


def test_every_copy_of_the_huge_rate_row_is_written(capped_runs):
    paths, _ = capped_runs
    manifest = json.loads(open(os.path.join(paths["rated_out"], ".batchtool_manifest.json")).read())
    copies = np.bincount(read_dir(paths["rated_out"]).column("key").to_numpy(), minlength=200)
    assert copies[7] == manifest["stats"]["copies_per_example"]["max"] >= 9_500
    assert copies.sum() == manifest["stats"]["rows_out"] == manifest["output"]["rows"]
    assert manifest["output"]["batches"] >= 7  # 100 MB of copies in pieces of about 16 MB


def test_replacement_output_has_the_asked_size_and_long_segments_all_segments(capped_runs):
    paths, _ = capped_runs
    stats = json.loads(open(os.path.join(paths["strat_out"], ".batchtool_manifest.json")).read())["stats"]
    assert stats["class_counts_after"] == {str(c): 100_000 for c in range(4)}
    assert json.loads(open(os.path.join(paths["seg_out"], ".batchtool_manifest.json")).read())["stats"]["segments"] == 4000


def test_a_balanced_batch_size_larger_than_the_data_finishes_at_once(tmp_path, run_cli):
    """The final batch's size is searched from what the classes can still fill, not from --batch-size down."""
    result = run_cli("stratify", PARQUET, tmp_path / "out", "--target", "uniform", "--balanced-batches",
                     "--batch-size", "1000000000", "-q")
    assert result.exit_code == 0, result.stderr
    assert read_dir(str(tmp_path / "out")).num_rows == 164
    layout = plan_layout(np.array([10**6, 3]), np.array([0.5, 0.5]), 10**12, partial=True, oversample=False)
    assert layout.batches == 0 and layout.partial == (4, 3)  # the exact shares of 7, which class 1's 3 rows allow


# -- the checks themselves, in process ----------------------------------------------------------------------


def bucket_plan(length_counts: np.ndarray, **options):
    """bucket's plan for a length histogram alone (8 bytes per step, 12 per row), under the default --memory: no
    data needed."""
    schema = pa.schema([("tokens", pa.list_(pa.int64()))])
    bucket_options = BucketOptions(**options)
    stats = DatasetStats(rows=int(length_counts.sum()), length_counts=length_counts)
    plan = make_plan(bucket_options, resolve_columns(bucket_options, schema), LengthPass(stats), schema, 0,
                     DEFAULT_MEMORY)
    return with_spill_layout(plan, (12.0, 8.0))


def histogram(counts: dict[int, int]) -> np.ndarray:
    out = np.zeros(max(counts) + 1, dtype=np.int64)
    for length, n in counts.items():
        out[length] = n
    return out


@pytest.mark.parametrize("options, message", [
    ({"boundaries": (10,), "batch_size": (10**8,), "order": "sorted"},
     r"--batch-size 100000000: one batch of bucket 1, 2,000 rows padded to up to 20,000 steps, takes about 305\.2 MB"),
    ({"boundaries": (10,), "max_tokens": 10**12},
     r"--max-tokens 1000000000000: one batch of bucket 1, 2,000 rows padded to up to 20,000 steps"),
    ({"boundaries": (10**7,), "batch_size": (4,), "pad_to_boundary": True},
     r"--batch-size 4: one batch of bucket 0, 4 rows padded to 9,999,999 steps "
     r"\(--pad-to-boundary, boundary 10000000\), takes about 305\.2 MB at once, more than --memory 1\.0 GB "
     r"allows \(128\.0 MB\); give a smaller --batch-size, drop --pad-to-boundary or a larger --memory"),
    ({"boundaries": tuple(range(1, 300_001)), "batch_size": (4,)},
     r"--boundaries \(300,000 values\): the bookkeeping of 300,001 buckets takes about 293\.0 MB"),
])
def test_bucket_refuses_batches_and_buckets_beyond_the_budget(options, message):
    with pytest.raises(UsageError, match=message):
        bucket_plan(histogram({5: 10, 20_000: 2000}), **options)


def test_bucket_takes_the_same_options_when_the_data_is_small():
    plan = bucket_plan(histogram({5: 10, 200: 20}), boundaries=(10,), batch_size=(10**8,))
    assert plan.num_buckets == 2


def test_auto_buckets_refuses_a_choice_too_large_for_the_budget():
    lengths = np.ones(10_001, dtype=np.int64)
    with pytest.raises(UsageError, match=r"--auto-buckets 20000: choosing 10,001 buckets among 10,001 distinct lengths "
                                         r"takes about 381\.5 MB at once"):
        bucket_plan(lengths, auto_buckets=20_000, batch_size=(4,))
    assert len(bucket_plan(lengths[:301], auto_buckets=20_000, batch_size=(4,)).boundaries) == 300


def test_a_buffer_of_more_rows_than_the_budget_holds_is_refused():
    first = Chunk(pa.record_batch({"x": np.zeros(100, dtype=np.int64)}), np.arange(100, dtype=np.uint64))
    options = shuffle_op.ShuffleOptions(buffer=10**8)
    with pytest.raises(UsageError, match=r"--buffer 100000000: a buffer of 100,000,000 rows takes about"):
        shuffle_op.check_memory(options, 1 << 20, first, rows=10**9)
    shuffle_op.check_memory(options, 1 << 20, first, rows=1000)  # a dataset smaller than the buffer: held whole


def test_segment_plans_world_size_x_batch_size_lanes():
    """The lanes' planning counts one lane per rank and row: N x B, not B."""
    options = SegmentOptions(key="key", sequence=("tokens",), num_unroll=1, batch_size=4, world_size=100_000)
    with pytest.raises(UsageError, match=r"--batch-size 4: 400,000 lanes \(100,000 ranks x 4\), each planning 4 "
                                         r"examples ahead takes about 390\.6 MB at once, more than --memory 1\.0 GB "
                                         r"allows \(128\.0 MB\); give a smaller --batch-size or --world-size, or a "
                                         r"larger --memory"):
        segment_op.check_memory(options, 1 << 30, None)
    assert segment_op.check_memory(replace(options, world_size=10), 1 << 30, None) == 10 * 4 * segment_op.METADATA_BYTES


def test_stratify_refuses_a_class_named_past_the_most_classes():
    with pytest.raises(UsageError, match=r"--target: 100,000,001 classes; at most 65,536"):
        StratifyOptions(target={0: 0.5, 10**8: 0.5}, mode="online")


def test_budget_errors_name_their_options_in_each_front_ends_words():
    """The same budget problem reads `--batch-size 64` on the command line and `key 'batch-size' = 64` in a
    pipeline file; a row's own value keeps its place and class (a data error naming --memory)."""
    with pytest.raises(UsageError) as caught:
        budget.check_rows("batch_size", 64, None, 1 << 30, 1 << 30)
    assert caught.value.rendered("cli") == str(caught.value) == (
        "--batch-size 64: one batch of 64 rows takes about 64.0 GB at once, more than --memory 1.0 GB allows "
        "(128.0 MB); give a smaller --batch-size or a larger --memory")
    assert caught.value.rendered("toml") == (
        "key 'batch-size' = 64: one batch of 64 rows takes about 64.0 GB at once, more than memory 1.0 GB allows "
        "(128.0 MB); give a smaller batch-size or a larger memory")
    with pytest.raises(InputError) as row:
        budget.check_fits("memory", "length 9", 1 << 40, 1 << 30, "check the column, or give a larger {memory}",
                          where="f.parquet, row 3: ", error=OptionInputError)
    assert row.value.rendered("toml") == ("f.parquet, row 3: length 9 takes about 1.0 TB at once, more than memory "
                                          "1.0 GB allows (128.0 MB); check the column, or give a larger memory")


def test_balance_refuses_more_bucket_and_class_groups_than_the_budget_holds(tmp_path, run_cli):
    """--balance keeps a spill group, counts and quotas per (bucket, class): 501 buckets x 2,000 classes is refused
    under the default --memory before any of it is allocated (it took 180 MB more than one class)."""
    lengths = np.arange(2000) % 499 + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table({"label": np.arange(2000), "tokens": pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(np.ones(offsets[-1], np.int32)))})
    os.makedirs(tmp_path / "src")
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    boundaries = ",".join(map(str, range(1, 501)))
    result = run_cli("bucket", tmp_path / "src", tmp_path / "dst", "--boundaries", boundaries, "--batch-size", "4",
                     "--balance", "label")
    assert result.exit_code == 2 and result.stderr == (
        "error: --balance label: balancing 2,000 classes in each of 501 buckets takes about 183.5 MB at once, more "
        "than --memory 1.0 GB allows (128.0 MB); give fewer buckets (or classes), or a larger --memory\n")
    assert sorted(os.listdir(tmp_path)) == ["src"]
