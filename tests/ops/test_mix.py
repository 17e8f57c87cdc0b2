"""`batchtool mix`: exact per-source counts (default, --replacement, --temperature), rows as their sources hold them,
exact per-batch shares, the same bytes for any threads and memory, one-line errors that leave DST alone."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memlimit import HANG_GUARD
from conftest import SAMPLE, data_bytes, read_dir, write_parquet_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtool.io.manifest import MANIFEST_NAME

SIZES = (120, 70, 45)


def source_table(index: int, rows: int) -> pa.Table:
    """Rows that say where they come from (key `s<index>-<row>`), with a list column to carry."""
    return pa.table({"key": pa.array([f"s{index}-{r}" for r in range(rows)], pa.string()),
                     "label": pa.array(np.arange(rows) % 3, pa.int64()),
                     "tokens": pa.array([list(range(r % 5 + 1)) for r in range(rows)], pa.list_(pa.int64()))})


def write_sources(root, sizes=SIZES, names=("en", "de", "fr")) -> list[str]:
    return [write_parquet_shards(str(root / name), source_table(i, n), shards=2, row_group_size=16)
            for i, (name, n) in enumerate(zip(names, sizes))]


@pytest.fixture
def sources(tmp_path) -> list[str]:
    return write_sources(tmp_path / "in")


def manifest(dst) -> dict:
    with open(os.path.join(dst, MANIFEST_NAME)) as f:
        return json.load(f)


def mixed(run_cli, srcs, dst, *args) -> pa.Table:
    result = run_cli("mix", *srcs, dst, "-q", *args)
    assert result.exit_code == 0, result.stderr
    return read_dir(str(dst))


def check_rows(out: pa.Table, sizes=SIZES) -> Counter:
    """Every output row is its source's row (source column = the key's source; the other columns as written) and
    how many times each key appears."""
    tables = {i: source_table(i, n).to_pylist() for i, n in enumerate(sizes)}
    for row in out.to_pylist():
        index, number = row["key"][1:].split("-")
        assert row["source"] == int(index)
        assert {k: v for k, v in row.items() if k != "source"} == tables[int(index)][int(number)]
    return Counter(out.column("key").to_pylist())


def per_source(out: pa.Table, k: int = 3) -> list[int]:
    return np.bincount(out.column("source").to_numpy(), minlength=k).tolist()


def exact_counts(sizes, weights) -> list[int]:
    """The issue's formula: floor(M w_i), M = min_i n_i / w_i over the weighted sources."""
    total = sum(Fraction(w) for w in weights)
    w = [Fraction(x) / total for x in weights]
    m = min(Fraction(n) / wi for n, wi in zip(sizes, w) if wi)
    return [math.floor(m * wi) for wi in w]


def test_default_takes_floor_m_w_of_each_source_each_row_once(tmp_path, sources, run_cli):
    out = mixed(run_cli, sources, tmp_path / "out", "--weights", "0.5,0.3,0.2")
    assert per_source(out) == exact_counts(SIZES, ["0.5", "0.3", "0.2"]) == [112, 67, 45]
    assert set(check_rows(out).values()) == {1}
    assert out.column("source").type == pa.int32()
    assert out.column("source").to_pylist() != sorted(out.column("source").to_pylist())  # shuffled
    m = manifest(tmp_path / "out")
    assert [(s["name"], s["rows"], s["taken"], s["repeats"]) for s in m["stats"]["sources"]] == \
        [("en", 120, 112, 0), ("de", 70, 67, 0), ("fr", 45, 45, 0)]
    assert [s["share"] for s in m["stats"]["sources"]] == [round(n / 224, 6) for n in (112, 67, 45)]
    assert [(s["index"], s["name"], s["src"]) for s in m["inputs"]["sources"]] == \
        [(i, n, src) for i, (n, src) in enumerate(zip(("en", "de", "fr"), sources))]
    shown = run_cli("inspect", tmp_path / "out").stdout.splitlines()
    assert [line.split() for line in shown[shown.index("  source  rows  weight  taken  repeats   share"):]][1:] == \
        [["en", "120", "0.5", "112", "0", "50.00%"], ["de", "70", "0.3", "67", "0", "29.91%"],
         ["fr", "45", "0.2", "45", "0", "20.09%"]]


def test_named_weights_and_names(tmp_path, sources, run_cli):
    out = mixed(run_cli, sources, tmp_path / "out", "--names", "a,b,c", "--weights", "c=1,a=2")
    assert per_source(out) == [90, 0, 45]


def test_replacement_repeats_a_small_source_evenly_and_takes_a_subset_of_a_large_one(tmp_path, sources, run_cli):
    out = mixed(run_cli, sources, tmp_path / "out", "--weights", "0.5,0.3,0.2", "--replacement", "--size", "301")
    assert per_source(out) == [151, 90, 60]  # 150.5, 90.3, 60.2: the largest remainder gets the extra row
    times = check_rows(out)
    for index, (n, taken) in enumerate(zip(SIZES, (151, 90, 60))):
        counts = [times.get(f"s{index}-{r}", 0) for r in range(n)]
        assert sum(counts) == taken and max(counts) - min(counts) <= 1, index
    stats = manifest(tmp_path / "out")["stats"]["sources"]
    assert [s["repeats"] for s in stats] == [31, 20, 15]


def test_size_ties_go_to_the_lower_source_index(tmp_path, sources, run_cli):
    out = mixed(run_cli, sources[:2], tmp_path / "out", "--weights", "1,1", "--size", "41")
    assert per_source(out, 2) == [21, 20]


@pytest.mark.parametrize("temperature, expected", [("1", list(SIZES)), ("2", [40, 28, 16])])
def test_temperature_weighs_sources_by_n_to_the_one_over_t(tmp_path, run_cli, temperature, expected):
    sizes = SIZES if temperature == "1" else (100, 49, 16)  # square roots 10, 7, 4: M = 16 * 21 / 4 = 84
    srcs = write_sources(tmp_path / "in", sizes)
    result = run_cli("mix", *srcs, tmp_path / "out", "--temperature", temperature)
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "out"))
    assert per_source(out) == expected
    check_rows(out, sizes)
    assert "en " in result.stderr and f"{sizes[0]:,}" in result.stderr  # the summary lists every source


@pytest.mark.parametrize("batch_size", [10, 7])
def test_every_batch_holds_each_source_s_share(tmp_path, sources, run_cli, batch_size):
    result = run_cli("mix", *sources, tmp_path / "out", "-q", "--weights", "0.5,0.3,0.2", "--replacement",
                     "--size", "400", "--batch-size", batch_size, "--to", "parquet")
    assert result.exit_code == 0, result.stderr
    files = sorted(p for p in (tmp_path / "out").iterdir() if p.name.startswith("part-"))
    groups = [pq.ParquetFile(f).read_row_group(i) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]
    target, running = np.array([0.5, 0.3, 0.2]), np.zeros(3)
    for group in groups[:-1]:
        assert group.num_rows == batch_size
        shares = np.bincount(group.column("source").to_numpy(), minlength=3)
        assert np.all(np.abs(shares - batch_size * target) < 1), shares
        running += shares
        assert np.all(np.abs(running - running.sum() * target) <= 1), running
    out = pa.concat_tables(groups)
    assert per_source(out) == [200, 120, 80]
    check_rows(out)


def test_same_bytes_for_any_threads_and_memory(tmp_path, sources, run_cli):
    for name, extra in (("a", ["--threads", "1"]), ("b", ["--threads", "3", "--memory", "20KB"])):
        mixed(run_cli, sources, tmp_path / name, "--weights", "2,1,1", "--replacement", "--size", "500", *extra)
        mixed(run_cli, sources, tmp_path / f"{name}-batches", "--weights", "2,1,1", "--batch-size", "8", "--pad",
              *extra)
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))
    assert data_bytes(str(tmp_path / "a-batches")) == data_bytes(str(tmp_path / "b-batches"))


def test_seeds_give_other_selections(tmp_path, sources, run_cli):
    a = mixed(run_cli, sources, tmp_path / "a", "--weights", "1,1,1")
    b = mixed(run_cli, sources, tmp_path / "b", "--weights", "1,1,1", "--seed", "5")
    assert per_source(a) == per_source(b) == [45, 45, 45]
    assert set(a.column("key").to_pylist()) != set(b.column("key").to_pylist())


def test_a_parquet_source_and_a_tfrecord_source_mix(tmp_path, run_cli):
    srcs = [os.path.join(SAMPLE, "parquet"), os.path.join(SAMPLE, "tfrecord")]
    out = mixed(run_cli, srcs, tmp_path / "out", "--weights", "parquet=0.7,tfrecord=0.3", "--columns", "key,label")
    assert out.column_names == ["key", "label", "source"]
    assert per_source(out, 2) == [4000, 1714]
    assert manifest(tmp_path / "out")["inputs"]["format"] == "parquet+tfrecord"


def test_an_input_column_named_source_takes_output_column(tmp_path, run_cli):
    tables = [source_table(i, 20).append_column("source", pa.array(["x"] * 20)) for i in range(2)]
    srcs = [write_parquet_shards(str(tmp_path / f"s{i}"), t, shards=1) for i, t in enumerate(tables)]
    result = run_cli("mix", *srcs, tmp_path / "bad", "--weights", "1,1")
    assert result.exit_code == 2 and "--output-column source=NEW_NAME" in result.stderr, result.stderr
    out = mixed(run_cli, srcs, tmp_path / "out", "--weights", "1,1", "--output-column", "source=origin")
    assert out.column("source").to_pylist() == ["x"] * 40 and sorted(set(out.column("origin").to_pylist())) == [0, 1]


@pytest.fixture
def odd_sources(tmp_path) -> dict[str, str]:
    """Sources that cannot be mixed with `sources`: an empty one, one with int32 labels, one without tokens."""
    base = source_table(5, 10)
    tables = {"empty": base.slice(0, 0),
              "int32": base.set_column(1, "label", base.column("label").cast(pa.int32())),
              "fewer": base.drop(["tokens"])}
    return {name: write_parquet_shards(str(tmp_path / "odd" / name), t, shards=1) for name, t in tables.items()}


def error_cases(srcs: list[str], odd: dict[str, str], tmp_path) -> list[tuple[list, str]]:
    en, de, fr = srcs
    return [
        ([en, de, "DST", "--weights", "1,2,3"], "--weights 1.0,2.0,3.0: 3 weights for 2 sources (en, de)"),
        ([en, de, "DST", "--weights", "1,-1"], "weights must be finite and >= 0 (got -1)"),
        ([en, de, "DST", "--weights", "0,0"], "every weight is 0"),
        ([en, de, "DST", "--weights", "en=1,xx=2"], "no source is named 'xx' (sources: en, de)"),
        ([en, de, "DST"], "give one of --weights, --temperature or --schedule"),
        ([en, de, "DST", "--weights", "1,1", "--temperature", "2"], "not --weights and --temperature"),
        ([en, de, "DST", "--temperature", "0"], "--temperature 0: must be a finite number > 0"),
        ([en, "DST", "--weights", "1"], "mix takes at least two sources"),
        ([en, de, "DST", "--weights", "1,1", "--names", "a"], "1 names for 2 sources"),
        ([en, os.path.join(str(tmp_path), "other", "en"), "DST", "--weights", "1,1"], "two sources are named 'en'"),
        ([en, de, "DST", "--weights", "1,1", "--size", "500"], "without --replacement the sources allow at most 140"),
        ([en, de, "DST", "--weights", "1,1", "--replacement"], "--replacement needs --size"),
        ([en, de, "DST", "--weights", "1,1", "--replacement", "--size", str(10**12)],
         "source 'de' has 70 rows, each would be written about 7.143e+09 times, more than 4294967296 copies"),
        ([en, odd["empty"], "DST", "--weights", "1,1"], f"source 'empty' ({odd['empty']}) is empty"),
        ([en, odd["int32"], "DST", "--weights", "1,1"],
         f"source 'int32' ({odd['int32']}): column 'label' is int32, but source 'en' ({en}) has int64"),
        ([en, odd["fewer"], "DST", "--weights", "1,1"], f"source 'fewer' ({odd['fewer']}) has no column 'tokens'"),
        ([en, os.path.join(en, "part-00000.parquet"), "DST", "--weights", "1,1", "--names", "a,b"],
         "sources may not overlap"),
        ([en, de, en + "/out", "--weights", "1,1"], "DST"),
        ([en, de, "DST", "--weights", "1,1", "--tmp-dir", de + "/tmp"], f"--tmp-dir {de}/tmp is inside the input {de}"),
        ([en, de, "DST", "--weights", "1,1", "--columns", "key,nope"], "nope"),
    ]


def test_errors_exit_2_with_one_line_and_leave_dst_as_it_was(tmp_path, sources, odd_sources, run_cli):
    os.makedirs(tmp_path / "other" / "en")
    write_parquet_shards(str(tmp_path / "other" / "en"), source_table(9, 5), shards=1)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "precious").write_text("x")
    before = sorted(os.listdir(tmp_path))
    for args, message in error_cases(sources, odd_sources, tmp_path):
        args = [dst if a == "DST" else a for a in args] + ["--overwrite"]
        result = run_cli("mix", *args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, result.stderr)
        assert os.listdir(dst) == ["precious"]
        assert sorted(os.listdir(tmp_path)) == before
    assert not os.path.exists(os.path.join(sources[0], "out"))


def test_a_batch_output_is_refused_as_a_source(tmp_path, sources, run_cli):
    assert run_cli("bucket", sources[0], tmp_path / "b", "-q", "--boundaries", "3", "--batch-size", "4",
                   "--length", "tokens").exit_code == 0
    result = run_cli("mix", tmp_path / "b", sources[1], tmp_path / "out", "--weights", "1,1")
    assert result.exit_code == 2 and "an output of batchtool bucket" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def largest_remainder(size: int, weights) -> list[int]:
    """The issue's --size split: floor(N w_i), then one more for the largest remainders, ties to the lower index."""
    exact = [Fraction(size * w, sum(weights)) for w in weights]
    counts = [math.floor(e) for e in exact]
    for i in sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))[:size - sum(counts)]:
        counts[i] += 1
    return counts


def check_batches(dst, weights, batch_size: int) -> None:
    """Every full batch holds floor or ceil of B w_i rows of source i; running totals stay within one row."""
    target = np.array(weights, dtype=float) / sum(weights)
    running = np.zeros(len(weights))
    for path in sorted(p for p in os.listdir(dst) if p.startswith("part-")):
        file = pq.ParquetFile(os.path.join(dst, path))
        for g in range(file.num_row_groups):
            shares = np.bincount(file.read_row_group(g).column("source").to_numpy(), minlength=len(weights))
            running += shares
            if shares.sum() == batch_size:
                assert np.all(np.abs(shares - batch_size * target) < 1), (shares, target)
                assert np.all(np.abs(running - running.sum() * target) <= 1 + 1e-9), (running, target)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 40), min_size=2, max_size=4),
       weights=st.lists(st.integers(0, 4), min_size=4, max_size=4), data=st.data())
def test_counts_follow_the_formula_for_any_sizes_and_weights(tmp_path_factory, run_cli, sizes, weights, data):
    weights = weights[:len(sizes)]
    if not any(weights):
        weights[0] = 1
    root = tmp_path_factory.mktemp("mix")
    srcs = write_sources(root, sizes, [f"s{i}" for i in range(len(sizes))])
    size = data.draw(st.one_of(st.none(), st.integers(1, 150)))
    batch_size = data.draw(st.sampled_from([None, 4, 7]))
    extra = (["--replacement", "--size", str(size)] if size else []) + \
        (["--batch-size", str(batch_size), "--to", "parquet"] if batch_size else [])
    result = run_cli("mix", *srcs, root / "out", "-q", "--weights", ",".join(map(str, weights)), *extra)
    assert result.exit_code == 0, result.stderr
    expected = largest_remainder(size, weights) if size else exact_counts(sizes, weights)
    if not sum(expected):
        return
    out = read_dir(str(root / "out"))
    taken = per_source(out, len(sizes))
    if batch_size:  # what the batches hold: the selection but a remainder no batch can take in its shares
        assert all(t <= e for t, e in zip(taken, expected)) and sum(expected) - sum(taken) < batch_size + len(sizes)
        check_batches(str(root / "out"), weights, batch_size)
    else:
        assert taken == expected
    times = check_rows(out, sizes)
    for i, n in enumerate(sizes):  # a row at most once; with --replacement k or k+1 times (a remainder the batches
        counts = [times.get(f"s{i}-{r}", 0) for r in range(n)]  # leave out may take one copy of some)
        if size:
            assert max(counts) - min(counts) <= 1 + bool(batch_size)
        else:
            assert max(counts) <= 1


def test_a_source_whose_share_rounds_down_to_nothing_is_warned_about(tmp_path, sources, run_cli):
    result = run_cli("mix", *sources, tmp_path / "out", "--weights", "1,1,1000")
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings[:2] == [f"warning: mix: source {name!r} gets no rows at weight 0.000998004 (its share of the "
                            "mixture rounds down to 0)" for name in ("en", "de")]
    assert warnings[2].startswith("warning: mix discarded 80.9% of the examples (190 of 235 never appear in DST)")
    assert per_source(read_dir(str(tmp_path / "out"))) == [0, 0, 45]


def test_discarding_most_of_the_input_warns_as_stratify_does(tmp_path, sources, run_cli):
    result = run_cli("mix", *sources[:2], tmp_path / "out", "--weights", "0.1,0.9", "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [  # M = 70 / 0.9: 7 of en's 120, all 70 of de's; even with --quiet
        "warning: mix discarded 59.5% of the examples (113 of 190 never appear in DST); weights nearer the sources' "
        "sizes keep more, or --replacement with a larger --size repeats the smaller sources instead"]
    assert per_source(read_dir(str(tmp_path / "out")), 2) == [7, 70]
    kept = run_cli("mix", *sources[:2], tmp_path / "kept", "--weights", "0.6,0.4", "-q")
    assert kept.exit_code == 0 and kept.stderr == ""  # 105 + 70 of 190: 7.9% discarded


@pytest.mark.parametrize("temperature", ["1e-300", "5e-324", "0.001"])
def test_a_temperature_near_0_gives_the_largest_source_all_the_weight(tmp_path, run_cli, temperature):
    srcs = write_sources(tmp_path / "in", (40, 25, 40))
    result = run_cli("mix", *srcs, tmp_path / "out", "--temperature", temperature)
    assert result.exit_code == 0, result.stderr
    assert per_source(read_dir(str(tmp_path / "out"))) == [40, 0, 40]  # the two largest tie: half each
    assert [s["weight"] for s in manifest(tmp_path / "out")["stats"]["sources"]] == [0.5, 0, 0.5]


@pytest.mark.parametrize("args, stored", [
    ([], "in 1 row group"), (["--to", "arrow"], "in 1 record batch"), (["--to", "tfrecord"], ""),
    (["--batch-size", "8"], "in 17 batches"), (["--batch-size", "8", "--to", "tfrecord"], "in 17 batches")])
def test_the_summary_says_batches_only_for_batches(tmp_path, sources, run_cli, args, stored):
    result = run_cli("mix", *sources, tmp_path / "out", "--weights", "1,1,1", *args)
    assert result.exit_code == 0, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"wrote 135 rows{' ' + stored if stored else ''} to 1 shard(s) in "), last


def test_a_size_whose_copies_cannot_fit_memory_is_refused_before_it_grows(tmp_path, sources):
    """Each map task builds one chunk's copies at once: a --size that makes them outgrow --memory is refused after the
    count pass, in one line, in a child capped far below what building them would take (10^9 rows: gigabytes)."""
    import memlimit
    dst = tmp_path / "out"
    run = memlimit.batchtool("mix", *sources[:2], str(dst), "--weights", "1,1", "--replacement", "--size",
                             str(10**9), limit_bytes=400 << 20, timeout=HANG_GUARD)
    assert not run.killed_for_memory and run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "error: --size 1,000,000,000: the copies of one chunk of source 'de' (16 rows, each written up to 7,142,858 "
        "times) takes about 5.1 GB at once, more than --memory 1.0 GB allows (128.0 MB); give a smaller --size"]
    assert not dst.exists()


def test_pad_gives_the_padded_arrays_bucket_gives(tmp_path, sources, run_cli):
    """--pad: the same batches as without it, each sequence column padded to the batch's longest row (with
    --pad-value), a `length` column of real steps and --mask's mask, so batchtool.load hands out [B, T] arrays."""
    import batchtool
    args = ["--weights", "0.5,0.3,0.2", "--batch-size", "10", "--to", "arrow"]
    mixed(run_cli, sources, tmp_path / "plain", *args)
    mixed(run_cli, sources, tmp_path / "padded", *args, "--pad", "--pad-value", "tokens=-1", "--mask")
    plain, padded = list(batchtool.load(str(tmp_path / "plain"))), list(batchtool.load(str(tmp_path / "padded")))
    assert len(plain) == len(padded) == 23 and plain[0]["tokens"].dtype == object
    for before, after in zip(plain, padded):
        assert list(after) == ["key", "label", "tokens", "source", "length", "mask"]
        assert after["key"].tolist() == before["key"].tolist()
        lengths = [len(t) for t in before["tokens"]]
        assert after["length"].tolist() == lengths and after["tokens"].shape == (len(lengths), max(lengths))
        for row, length, tokens in zip(after["tokens"], lengths, before["tokens"]):
            assert row[:length].tolist() == list(tokens) and (row[length:] == -1).all()
        assert (after["mask"] == (np.arange(max(lengths)) < np.array(lengths)[:, None])).all()


def test_pad_errors_name_the_option_or_the_row(tmp_path, sources, run_cli):
    table = source_table(0, 20)
    two = table.append_column("frames", pa.array([[0.5] * (r % 5 + 1 + (r == 13)) for r in range(20)]))
    odd = write_parquet_shards(str(tmp_path / "odd"), two, shards=1)
    other = write_parquet_shards(str(tmp_path / "other"), source_table(1, 20).append_column(
        "frames", pa.array([[0.5] * (r % 5 + 1) for r in range(20)])), shards=1)
    lengthy = [write_parquet_shards(str(tmp_path / f"l{i}"), source_table(i, 20).append_column(
        "length", pa.array(np.arange(20))), shards=1) for i in range(2)]
    en, de = sources[:2]
    cases = [
        ([en, de, "--pad"], "--pad needs --batch-size"),
        ([en, de, "--batch-size", "4", "--pad", "--columns", "key,label"],
         "no list (sequence) column to pad (columns: key, label, source); leave out --pad"),
        ([en, de, "--batch-size", "4", "--mask"], "--mask goes with --pad"),
        ([en, de, "--batch-size", "4", "--pad", "--sequence", "label"], "--sequence label: column is int64, expected"),
        ([en, de, "--batch-size", "4", "--pad", "--pad-value", "label=1"], "'label' is not a padded sequence column"),
        ([*lengthy, "--batch-size", "4", "--pad"], "column 'length' is also an output column of mix; name mix's "
                                                   "otherwise with --output-column length=NEW_NAME"),
        ([odd, other, "--batch-size", "4", "--pad"], f"{odd}/part-00000.parquet, row 13: sequence columns disagree "
                                                     "in length: 'tokens' has 4 steps, 'frames' has 5"),
    ]
    for args, message in cases:
        result = run_cli("mix", *args[:2], tmp_path / "dst", "--weights", "1,1", *args[2:])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, result.stderr)
        assert not (tmp_path / "dst").exists()
    out = mixed(run_cli, [odd, other], tmp_path / "one", "--weights", "1,1", "--batch-size", "4", "--pad",
                "--sequence", "tokens")
    assert out.column("frames").type == pa.list_(pa.float64()) and set(out.column("length").to_pylist()) == {1, 2, 3, 4, 5}
