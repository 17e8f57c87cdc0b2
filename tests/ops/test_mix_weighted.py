"""mix --by tokens and --schedule: the quota batches by documents' counts and by a schedule's integral stay within
one document of each source's target at every batch; tiny weights get their documents; caps and bad schedules are
one error line."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE, invoke_cli
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchtool.io.manifest import MANIFEST_NAME
from batchtool.ops.mix.schedule import Point, Schedule
from batchtool.ops.quotas import Constant, Documents, QuotaLayout, plan_layout


def _within_one_document(layout, lengths, curve) -> None:
    """After every full batch, each source's count is within one of its documents of the curve at j B: behind by
    less than its next document, ahead by less than its last one."""
    docs = np.zeros(len(lengths), dtype=np.int64)
    for j, quota in enumerate(layout.sequence()):
        if j >= layout.batches:
            break
        docs += quota
        target = curve.at((j + 1) * layout.batch_size)
        for i, own in enumerate(lengths):
            counted = int(own[:docs[i]].sum())
            following = max(int(own[docs[i]]) if docs[i] < len(own) else 1, 1)
            last = max(int(own[docs[i] - 1]) if docs[i] else 1, 1)
            assert target[i] - counted < following + 1e-6, (j, i)
            assert counted - target[i] < last + 1e-6, (j, i)


def _docs(lengths) -> Documents:
    return Documents(tuple(np.concatenate([[0], np.cumsum(own)]).astype(np.int64) for own in lengths))


lengths_st = st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=120), min_size=2, max_size=4)


@settings(max_examples=25, deadline=None)
@given(lengths_st, st.lists(st.sampled_from([0.0, 1e-3, 0.1, 0.3, 0.5, 1.0]), min_size=4, max_size=4), st.integers(1, 200))
def test_token_shares_within_one_document_per_batch(lengths, raw, size):
    weights = np.array(raw[:len(lengths)])
    if not weights.sum():
        weights[0] = 1.0
    weights = weights / weights.sum()
    available = np.array([len(own) for own in lengths])
    layout = plan_layout(available, weights, size, partial=True, oversample=False, docs=_docs(lengths))
    _within_one_document(layout, [np.array(own) for own in lengths], Constant(weights))
    assert np.all(layout.per_class <= available)
    assert np.all(layout.per_class[weights == 0] == 0)


@settings(max_examples=40, deadline=None)
@given(lengths_st, st.lists(st.sampled_from([0.0, 1e-3, 0.1, 0.3, 0.5, 1.0]), min_size=4, max_size=4),
       st.integers(1, 1500), st.booleans())
def test_the_last_batch_is_the_one_a_search_of_every_size_finds(lengths, raw, size, scheduled):
    """The last batch of documents is searched from below the first size that overruns a source, not from
    --batch-size down: the same batch as trying every size (byte for byte the same output)."""
    weights = np.array(raw[:len(lengths)])
    if not weights.sum():
        weights[0] = 1.0
    weights = weights / weights.sum()
    curve = Schedule("s.toml", (Point(0, tuple(weights)), Point(size * 2, tuple(weights[::-1])))).curve() \
        if scheduled else None
    available = np.array([len(own) for own in lengths])
    planned = plan_layout(available, weights, size, partial=True, oversample=False, docs=_docs(lengths), curve=curve)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(QuotaLayout, "below_overrun", lambda self, used, given, left, largest: largest)
        every = plan_layout(available, weights, size, partial=True, oversample=False, docs=_docs(lengths),
                            curve=curve)
    assert (planned.batches, planned.partial) == (every.batches, every.partial)


@st.composite
def schedules(draw):
    k = draw(st.integers(2, 4))
    ats = sorted(set(draw(st.lists(st.integers(0, 1500), min_size=1, max_size=4))))
    points = []
    for at in ats:
        w = np.array(draw(st.lists(st.sampled_from([0.0, 1e-3, 0.1, 0.3, 0.5, 1.0]), min_size=k, max_size=k)))
        if not w.sum():
            w[draw(st.integers(0, k - 1))] = 1.0
        points.append(Point(at, tuple((w / w.sum()).tolist())))
    return Schedule("s.toml", tuple(points), draw(st.sampled_from(["linear", "step"])))


@settings(max_examples=25, deadline=None)
@given(schedules(), st.integers(20, 300), st.integers(200, 1500), st.booleans(),
       st.lists(st.floats(0.05, 1.0), min_size=4, max_size=4))
def test_schedule_counts_within_one_document_of_the_integral(schedule, size, rows, tokens, caps):
    """At every batch, for random schedules, batch sizes and caps (max-fraction): within one document of the
    integral, and no source past its cap."""
    k = len(schedule.points[0].weights)
    rng = np.random.default_rng(size)
    lengths = [rng.integers(1, 30, rows) if tokens else np.ones(rows, dtype=np.int64) for _ in range(k)]
    docs = _docs(lengths) if tokens else None
    curve = schedule.curve()
    capped = Schedule("s.toml", schedule.points, max_fraction=tuple(caps[:k])).caps(np.full(k, rows), False)
    layout = plan_layout(capped, np.asarray(schedule.points[0].weights), size, partial=True,
                         oversample=False, curve=curve, **({"docs": docs} if docs else {}))
    _within_one_document(layout, lengths, curve)
    assert np.all(layout.per_class <= capped)


def test_schedule_integral_is_exact_on_a_linear_ramp():
    schedule = Schedule("s.toml", (Point(0, (1.0, 0.0)), Point(100, (0.0, 1.0))))
    assert np.allclose(schedule.curve().at(100), [50, 50])
    assert np.allclose(schedule.curve().at(150), [50, 100])
    step = Schedule("s.toml", (Point(0, (1.0, 0.0)), Point(100, (0.0, 1.0))), "step")
    assert np.allclose(step.curve().at(150), [100, 50])


def test_a_weight_of_one_in_a_million_gives_its_ten_rows_at_their_places():
    """1e-6 over 10^7 rows: ten rows of the tiny source, the k-th in the batch where its integral reaches k."""
    weights = np.array([1 - 1e-6, 1e-6])
    size = 10_000
    layout = plan_layout(np.array([10**7, 10**7]), weights, size, partial=False, oversample=False)
    quotas = np.array(list(layout.sequence()))
    assert layout.batches == 1000
    tiny = np.flatnonzero(quotas[:, 1])
    assert quotas[:, 1].sum() == 10
    # its k-th row comes in the batch where its integral passes k - 1/2 (its largest remainder): within one row
    assert tiny.tolist() == [50, 150, 250, 350, 450, 550, 650, 750, 850, 950]
    running = np.cumsum(quotas[:, 1])
    assert np.all(np.abs(running - 1e-6 * size * np.arange(1, 1001)) < 1)


# -- the command ---------------------------------------------------------------------------------------------------


def _sources(tmp_path, lengths=((3, 40), (1, 5))) -> list[str]:
    """Two sources of 300 rows each: short and long documents."""
    paths = []
    for i, (low, high) in enumerate(lengths):
        n = np.random.default_rng(i).integers(low, high, 300)
        table = pa.table({"key": np.arange(300) + 1000 * i, "tokens": [list(range(m)) for m in n.tolist()],
                          "n": n})
        path = tmp_path / f"s{i}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths


def test_by_tokens_gives_each_source_its_share_of_tokens_batch_after_batch(tmp_path, run_cli):
    srcs = _sources(tmp_path)
    dst = tmp_path / "out"
    result = run_cli("mix", *srcs, dst, "--weights", "0.5,0.5", "--by", "tokens", "--batch-size", 256, "--quiet")
    assert result.exit_code == 0, result.output
    reader = pa.ipc.open_file(next(p for p in dst.iterdir() if p.suffix == ".arrow"))
    totals = np.zeros(2)
    for j in range(reader.num_record_batches - 1):
        batch = reader.get_batch(j)
        source = batch.column("source").to_numpy()
        n = batch.column("n").to_numpy()
        totals += [n[source == 0].sum(), n[source == 1].sum()]
        assert np.all(np.abs(totals - (j + 1) * 128) < 40), (j, totals)  # one document: at most 39 tokens
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    shares = [s["token_share"] for s in manifest["stats"]["sources"]]
    assert abs(shares[0] - 0.5) < 40 / sum(s["tokens"] for s in manifest["stats"]["sources"])
    by_length = run_cli("mix", *srcs, tmp_path / "out2", "--weights", "0.5,0.5", "--by", "tokens", "--length", "n",
                        "--batch-size", 256, "--quiet")
    assert by_length.exit_code == 0
    assert (tmp_path / "out2" / "part-00000.arrow").read_bytes() == (dst / "part-00000.arrow").read_bytes()


def test_schedule_runs_and_is_recorded(tmp_path, run_cli):
    dst = tmp_path / "out"
    result = run_cli("mix", f"{SAMPLE}/parquet", f"{SAMPLE}/tfrecord", dst, "--schedule", f"{SAMPLE}/schedule.toml",
                     "--batch-size", 64, "--quiet")
    assert result.exit_code == 0, result.output
    stats = json.loads((dst / MANIFEST_NAME).read_text())["stats"]
    assert stats["schedule"]["points"][1] == {"at": 2000, "weights": {"parquet": 0.25, "tfrecord": 0.75}}
    assert [s["taken"] for s in stats["sources"]] == [1500, 1500]


@pytest.mark.parametrize("text, message", [
    ('interpolation = "cubic"\n[[point]]\nat = 0\nweights = { a = 1 }\n', "interpolation: expected one of"),
    ('[[point]]\nat = 0\nweights = { c = 1 }\n', "point 1.weights.c: no source is named 'c'"),
    ('[[point]]\nat = 5\nweights = { a = 1 }\n[[point]]\nat = 5\nweights = { b = 1 }\n', "point 2.at: 5 is not after"),
    ('[[point]]\nat = 0\nweights = { a = -1 }\n', "point 1.weights.a: expected a finite number >= 0"),
    ('[[point]]\nat = 0\nweights = { a = 1 }\n[source.a]\nmax-repeats = 0\n', "source.a.max-repeats"),
    ('[[point]\n', "not valid TOML"),
])
def test_a_bad_schedule_is_one_line_naming_the_file_and_key(tmp_path, run_cli, text, message):
    srcs = _sources(tmp_path)
    schedule = tmp_path / "s.toml"
    schedule.write_text(text)
    result = run_cli("mix", *srcs, tmp_path / "out", "--names", "a,b", "--schedule", schedule, "--batch-size", 16)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {schedule}: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")


def test_a_source_that_runs_out_under_its_cap_is_an_error_and_replacement_repeats_it(tmp_path, run_cli):
    srcs = _sources(tmp_path)
    schedule = tmp_path / "s.toml"
    schedule.write_text('total = 700\n[[point]]\nat = 0\nweights = { a = 1, b = 1 }\n[source.b]\nmax-repeats = 2\n')
    result = run_cli("mix", *srcs, tmp_path / "out", "--names", "a,b", "--schedule", schedule, "--batch-size", 10)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: source 'a' runs out") and "its 300 rows" in result.stderr
    assert not os.path.exists(tmp_path / "out")
    again = run_cli("mix", *srcs, tmp_path / "out", "--names", "a,b", "--schedule", schedule, "--batch-size", 10,
                    "--replacement", "--quiet")
    assert again.exit_code == 0, again.stderr
    keys = pa.ipc.open_file(tmp_path / "out" / "part-00000.arrow").read_all().column("key").to_numpy()
    counts = np.bincount(keys[keys < 1000])
    assert len(keys) == 700 and set(counts.tolist()) == {1, 2}  # a's 350 rows: each of its 300 once or twice
    too_many = tmp_path / "t.toml"
    too_many.write_text('total = 1300\n[[point]]\nat = 0\nweights = { a = 1, b = 1 }\n[source.b]\nmax-repeats = 2\n')
    capped = run_cli("mix", *srcs, tmp_path / "out3", "--names", "a,b", "--schedule", too_many, "--batch-size", 10,
                     "--replacement")
    assert capped.exit_code == 2 and "source 'b' runs out" in capped.stderr and "cap of 600 rows" in capped.stderr


def test_a_pipeline_takes_the_schedule_beside_its_file_and_writes_the_commands_bytes(tmp_path, run_cli):
    srcs = _sources(tmp_path)
    (tmp_path / "s.toml").write_text('[[point]]\nat = 0\nweights = { a = 1, b = 0 }\n[[point]]\nat = 300\n'
                                     'weights = { a = 0, b = 1 }\n')
    (tmp_path / "p.toml").write_text('[input]\npath = ["s0.parquet", "s1.parquet"]\n[[stage]]\nop = "mix"\n'
                                     'names = ["a", "b"]\nschedule = "s.toml"\nby = "tokens"\nbatch-size = 100\n'
                                     '[output]\npath = "piped"\n')
    piped = run_cli("run", tmp_path / "p.toml", "--quiet")
    assert piped.exit_code == 0, piped.stderr
    direct = run_cli("mix", *srcs, tmp_path / "direct", "--names", "a,b", "--schedule", tmp_path / "s.toml",
                     "--by", "tokens", "--batch-size", 100, "--quiet")
    assert direct.exit_code == 0, direct.stderr
    assert (tmp_path / "piped" / "part-00000.arrow").read_bytes() == \
        (tmp_path / "direct" / "part-00000.arrow").read_bytes()


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 12), st.sampled_from([0.1, 0.5, 0.9]), st.booleans())
@example(9, 0.1, False)  # DST's 9th batch is its 23-row remainder: no step to continue at
@example(8, 0.1, False)
def test_replanning_keeps_the_prefix_and_loses_or_repeats_nothing(tmp_path_factory, step, late, tokens):
    tmp_path = tmp_path_factory.mktemp("replan")
    srcs = _sources(tmp_path)
    (tmp_path / "early.toml").write_text('[[point]]\nat = 0\nweights = { a = 1, b = 0 }\n[[point]]\nat = 1000\n'
                                         'weights = { a = 0.2, b = 0.8 }\n')
    (tmp_path / "late.toml").write_text(f'interpolation = "step"\n[[point]]\nat = 0\n'
                                        f'weights = {{ a = {late}, b = {1 - late} }}\n')
    by = ["--by", "tokens"] if tokens else []
    common = ["--names", "a,b", "--batch-size", 40, "--quiet", *by]
    assert run_mix(*srcs, tmp_path / "dst", "--schedule", tmp_path / "early.toml", *common) == 0
    stats = json.loads((tmp_path / "dst" / ".batchtool_manifest.json").read_text())["stats"]
    full = stats["balanced_batches"] - bool(sum(stats["final_batch_quotas"]))
    continued = invoke_cli("mix", *srcs, tmp_path / "dst2", "--continue", tmp_path / "dst", "--at", step,
                           "--schedule", tmp_path / "late.toml", *common)
    if step > full:  # DST's last batch, cut short by its end, is no step of a plan that goes on
        assert continued.exit_code == 2 and f"has {full} full batches" in continued.stderr, continued.stderr
        return
    assert continued.exit_code == 0, continued.stderr
    before = pa.ipc.open_file(tmp_path / "dst" / "part-00000.arrow")
    after = pa.ipc.open_file(tmp_path / "dst2" / "part-00000.arrow")
    for j in range(min(step, before.num_record_batches)):
        assert after.get_batch(j).equals(before.get_batch(j)), j
    keys = after.read_all().column("key").to_numpy()
    assert len(np.unique(keys)) == len(keys)  # no row twice
    # every row of the exhausted source is used: none lost
    sources = after.read_all().column("source").to_numpy()
    assert 300 in np.bincount(sources, minlength=2).tolist()
    manifest = json.loads((tmp_path / "dst2" / MANIFEST_NAME).read_text())
    assert manifest["options"]["previous"]["at"] == step
    assert manifest["options"]["previous"]["schedule"]["points"][1]["at"] == 1000
    assert manifest["stats"]["schedule"]["interpolation"] == "step"


def run_mix(*args) -> int:
    return invoke_cli("mix", *args).exit_code


def test_continue_errors_are_one_line(tmp_path, run_cli):
    srcs = _sources(tmp_path)
    assert run_cli("mix", *srcs, tmp_path / "rows", "--weights", "1,1", "--quiet").exit_code == 0
    for args, message in [
        (["--continue", tmp_path / "rows", "--at", 1, "--by", "tokens", "--weights", "1,1"], "not the output of"),
        (["--continue", tmp_path / "rows", "--weights", "1,1"], "go together"),
        (["--continue", tmp_path / "rows", "--at", 1, "--weights", "1,1"], "needs --schedule or --by tokens"),
    ]:
        result = run_cli("mix", *srcs, tmp_path / "x", *args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "x")


def test_by_tokens_is_the_same_bytes_on_every_engine_and_refuses_bad_counts(tmp_path, run_cli):
    srcs = _sources(tmp_path)
    args = ["--weights", "0.3,0.7", "--by", "tokens", "--batch-size", 200, "--quiet"]
    assert run_cli("mix", *srcs, tmp_path / "one", *args, "--threads", 1).exit_code == 0
    assert run_cli("mix", *srcs, tmp_path / "two", *args, "--engine", "processes", "--threads", 2).exit_code == 0
    assert (tmp_path / "one" / "part-00000.arrow").read_bytes() == (tmp_path / "two" / "part-00000.arrow").read_bytes()
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"key": [1, 2], "tokens": [[1], [2, 3]], "n": [3, -1]}), bad)
    result = run_cli("mix", srcs[0], bad, tmp_path / "x", "--weights", "1,1", "--by", "tokens", "--length", "n")
    assert result.exit_code == 2 and "bad.parquet" in result.stderr and "'n': -1 is not a count" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "x")
