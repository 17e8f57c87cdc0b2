"""segment: NextQueuedSequenceBatch's metadata on hand-worked examples, lane-stable batches, checks, and the key hashes."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_dir, write_parquet_shards

import batchtool
from batchtool.core.errors import InputError, SchemaError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.segment import lanes
from batchtool.ops.segment import OP as SEGMENT
from batchtool.ops.segment import SegmentOptions
from batchtool.ops.segment.batches import FIRST_INSERTION_INDEX, compact_batches
from batchtool.io import batch_check
from batchtool.io.formats.arrow import FORMAT as ARROW
from batchtool.ops.segment.chunks import key_hashes
from batchtool.io.output import OutputOptions
from batchtool.pipeline.config import load
from batchtool.pipeline.execute import run_pipeline
from batchtool.core.synthetic import make_table

QUIET = RunSettings(threads=2, quiet=True)


def table_of(lengths: list[int], keys: list[str] | None = None, **extra: pa.Array) -> pa.Table:
    """Example i has tokens 1000 * i + (1, 2, ...), so every step is recognisable; `label` is i."""
    keys = keys or [f"ex{i}" for i in range(len(lengths))]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = np.concatenate([np.arange(1, n + 1) + 1000 * i for i, n in enumerate(lengths)]) if lengths else []
    return pa.table({"key": pa.array(keys, pa.string()), "label": pa.array(range(len(lengths)), pa.int64()),
                     "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens, pa.int64())), **extra})


def run(tmp_path, table: pa.Table, name: str = "dst", **options) -> tuple[pa.Table, dict]:
    src = tmp_path / f"{name}-src"
    os.makedirs(src)
    pq.write_table(table, src / "part-0.parquet", row_group_size=7)
    defaults = {"key": "key", "sequence": ("tokens",)}
    result = run_operation(SEGMENT, SegmentOptions(**{**defaults, **options}), str(src), str(tmp_path / name),
                           OutputOptions(), QUIET)
    return read_dir(str(tmp_path / name)), result.manifest


def test_length_45_unroll_20_gives_the_seeds_three_segments(tmp_path):
    out, manifest = run(tmp_path, table_of([45], keys=["ex"]), num_unroll=20, batch_size=1,
                        pad_value=("tokens=-1",))
    rows = out.to_pylist()
    assert [r["key"] for r in rows] == ["00000_of_00003:ex", "00001_of_00003:ex", "00002_of_00003:ex"]
    assert [r["next_key"] for r in rows] == ["00001_of_00003:ex", "00002_of_00003:ex", "STOP:ex"]
    assert [r["sequence"] for r in rows] == [0, 1, 2]
    assert [r["sequence_count"] for r in rows] == [3, 3, 3]
    assert [r["length"] for r in rows] == [20, 20, 5]
    assert [r["total_length"] for r in rows] == [45, 45, 45]
    assert [r["insertion_index"] for r in rows] == [FIRST_INSERTION_INDEX] * 3
    assert [r["lane"] for r in rows] == [0, 0, 0] and [r["batch"] for r in rows] == [0, 1, 2]
    assert rows[0]["tokens"] == list(range(1, 21))
    assert rows[2]["tokens"] == list(range(41, 46)) + [-1] * 15
    assert manifest["stats"]["segments"] == 3 and manifest["stats"]["empty_slots"] == 0
    assert manifest["stats"]["padding_efficiency"] == pytest.approx(45 / 60)
    assert out.schema.field("sequence").type == pa.int32() and out.schema.field("insertion_index").type == pa.int64()


def test_input_length_counts_real_steps_but_keeps_the_data(tmp_path):
    out, _ = run(tmp_path, table_of([45], keys=["ex"], real=pa.array([30])), num_unroll=20, batch_size=1,
                 input_length="real")
    assert out.column("length").to_pylist() == [20, 10, 0]
    assert out.column("total_length").to_pylist() == [30, 30, 30]
    assert out.column("sequence_count").to_pylist() == [3, 3, 3]
    assert out.column("tokens").to_pylist()[2] == list(range(41, 46)) + [0] * 15


def test_a_length_zero_example_is_one_all_padding_segment(tmp_path):
    out, _ = run(tmp_path, table_of([0, 3], keys=["empty", "b"]), num_unroll=4, batch_size=2)
    rows = {r["key"]: r for r in out.to_pylist()}
    assert rows["00000_of_00001:empty"]["next_key"] == "STOP:empty"
    assert rows["00000_of_00001:empty"]["length"] == 0
    assert rows["00000_of_00001:empty"]["tokens"] == [0, 0, 0, 0]
    assert rows["00000_of_00001:b"]["tokens"] == [1001, 1002, 1003, 0]


def test_no_pad_accepts_multiples_and_names_the_row_that_is_not(tmp_path):
    out, _ = run(tmp_path, table_of([4, 8]), num_unroll=4, batch_size=1, pad=False)
    assert out.column("length").to_pylist() == [4, 4, 4]
    with pytest.raises(InputError, match=r"row 1: column 'tokens' has 6 steps, not a positive multiple of "
                                         r"--num-unroll 4"):
        run(tmp_path, table_of([4, 6]), "b", num_unroll=4, batch_size=1, pad=False)
    with pytest.raises(InputError, match=r"row 0: .* has 0 steps"):
        run(tmp_path, table_of([0]), "c", num_unroll=4, batch_size=1, pad=False)


def test_lanes_play_each_example_in_consecutive_batches(tmp_path):
    corpus = make_table(400, seed=3)
    out, manifest = run(tmp_path, corpus, num_unroll=7, batch_size=5, context=("label", "weight"))
    B = 5
    assert out.num_rows % B == 0 and out.num_rows // B == manifest["stats"]["batches"]
    assert out.column("lane").to_pylist() == list(range(B)) * (out.num_rows // B)
    lengths = {k: len(t) for k, t in zip(corpus.column("key").to_pylist(), corpus.column("tokens").to_pylist())}
    by_key = {k: (lab, w) for k, lab, w in zip(corpus.column("key").to_pylist(), corpus.column("label").to_pylist(),
                                              corpus.column("weight").to_pylist())}
    seen: dict[str, list] = {}
    for r in out.to_pylist():
        if r["key"]:
            seen.setdefault(r["key"].split(":", 1)[1], []).append(r)
    assert sorted(seen) == sorted(lengths)
    for key, rows in seen.items():
        assert [r["sequence"] for r in rows] == list(range(len(rows)))
        assert len({r["lane"] for r in rows}) == 1
        assert [r["batch"] for r in rows] == list(range(rows[0]["batch"], rows[0]["batch"] + len(rows)))
        assert {(r["label"], r["weight"]) for r in rows} == {by_key[key]}
        assert {r["insertion_index"] for r in rows} == {rows[0]["insertion_index"]}
        assert sum(r["length"] for r in rows) == lengths[key] == rows[0]["total_length"]
        assert len(rows) == rows[0]["sequence_count"] == -(-lengths[key] // 7)
    # insertion_index follows input order, one value per example
    order = sorted(seen, key=lambda k: seen[k][0]["insertion_index"])
    assert order == corpus.column("key").to_pylist()
    assert seen[order[0]][0]["insertion_index"] == FIRST_INSERTION_INDEX
    assert seen[order[-1]][0]["insertion_index"] == FIRST_INSERTION_INDEX + 399


def test_empty_rows_keep_the_layout_and_reset_cleanly(tmp_path):
    out, manifest = run(tmp_path, table_of([9, 2, 2]), num_unroll=2, batch_size=3, context=("label",))
    empty = [r for r in out.to_pylist() if not r["key"]]
    assert manifest["stats"]["empty_slots"] == len(empty) > 0
    for r in empty:
        assert r["next_key"] == "" and r["sequence"] == 0 and r["sequence_count"] == 0 and r["length"] == 0
        assert r["tokens"] == [0, 0] and r["label"] == 0
    assert manifest["stats"]["empty_slot_fraction"] == pytest.approx(len(empty) / out.num_rows)


def test_allow_small_batch_drops_empty_rows_only(tmp_path):
    full, _ = run(tmp_path, table_of([9, 2, 2]), "full", num_unroll=2, batch_size=3)
    small, manifest = run(tmp_path, table_of([9, 2, 2]), "small", num_unroll=2, batch_size=3,
                          allow_small_batch=True)
    assert small.to_pylist() == [r for r in full.to_pylist() if r["key"]]
    assert manifest["stats"]["rows_written"] == small.num_rows == manifest["stats"]["segments"]
    sizes = [len(b["key"]) for b in batchtool.load(str(tmp_path / "small"))]
    assert sizes[0] == 3 and sizes[-1] == 1


def test_initial_state_on_first_segments_zeros_elsewhere(tmp_path):
    init = pa.array([[1.5, 2.5], [3.5, 4.5]], pa.list_(pa.float32()))
    out, _ = run(tmp_path, table_of([5, 1], init=init), num_unroll=2, batch_size=2, initial_state=("h=init",))
    for r in out.to_pylist():
        if r["sequence"] == 0 and r["key"]:
            assert r["h"] == ([1.5, 2.5] if r["key"].endswith("ex0") else [3.5, 4.5])
        else:
            assert r["h"] == [0.0, 0.0]


def test_empty_slot_fraction_under_two_percent_on_a_long_tailed_corpus(tmp_path):
    """5,000 examples (1.2% of the slots empty; 10,000 give 0.9% and take three times as long)."""
    corpus = make_table(5_000, seed=11, median_length=30, max_length=400, frame_dim=1).select(["key", "tokens"])
    _, manifest = run(tmp_path, corpus, num_unroll=20, batch_size=32)
    stats = manifest["stats"]
    assert stats["examples"] == 5_000
    assert stats["empty_slot_fraction"] < 0.02
    assert stats["empty_slots"] == stats["batches"] * 32 - stats["segments"]


def test_several_sequence_columns_share_the_time_axis(tmp_path):
    corpus = make_table(50, seed=5)
    out, _ = run(tmp_path, corpus, num_unroll=8, batch_size=4, sequence=("tokens", "frames"))
    for r in out.to_pylist():
        assert len(r["tokens"]) == len(r["frames"]) == 8
        assert all(f == [0.0, 0.0, 0.0] for f in r["frames"][r["length"]:])
    bad = corpus.set_column(3, "tokens", pa.array([[1]] * 50, pa.list_(pa.int64())))
    with pytest.raises(SchemaError, match=r"row 0: sequence columns disagree in length"):
        run(tmp_path, bad, "bad", num_unroll=8, batch_size=4, sequence=("tokens", "frames"))


@pytest.mark.parametrize(("keys", "message"), [
    (["a", "b", "a"], r"duplicate key 'a': .*part-0.parquet, row 0 and .*part-0.parquet, row 2"),
    (["a", "b:c"], r"row 1: key 'b:c' contains ':'"),
])
def test_bad_keys_name_the_rows(tmp_path, keys, message):
    with pytest.raises(InputError, match=message):
        run(tmp_path, table_of([3] * len(keys), keys=keys), num_unroll=2, batch_size=2)
    assert not os.path.exists(tmp_path / "dst")


def test_large_string_keys_give_the_string_keys_bytes(tmp_path):
    """pandas writes its strings as large_string: the keys are the same, so the output is too (a traceback once)."""
    table = table_of([3, 1, 5, 2])
    wide = table.set_column(0, "key", table.column("key").cast(pa.large_string()))
    assert run(tmp_path, wide, "wide", num_unroll=2, batch_size=2)[0] == run(tmp_path, table, num_unroll=2,
                                                                             batch_size=2)[0]


def test_input_length_longer_than_the_sequence_names_the_row(tmp_path):
    with pytest.raises(InputError, match=r"row 1: column 'real' is 9, but the sequence has 3 steps"):
        run(tmp_path, table_of([3, 3], real=pa.array([3, 9])), num_unroll=2, batch_size=2, input_length="real")


@pytest.mark.parametrize(("options", "message"), [
    ({"num_unroll": 0}, r"--num-unroll 0: must be at least 1"),
    ({"batch_size": 0}, r"--batch-size 0: must be at least 1"),
    ({"sequence": ("to:kens",)}, r"--sequence 'to:kens': names may not contain ':'"),
    ({"context": ("a:b",)}, r"--context 'a:b': names may not contain ':'"),
    ({"initial_state": ("s:t=label",)}, r"--initial-state 's:t': names may not contain ':'"),
    ({"context": ("length",)}, r"column 'length' is also an output column of segment; name segment's otherwise with "
                               r"--output-column length=NEW_NAME, or give yours as --input-length if it counts real "
                               r"steps"),
    ({"sequence": ("lane",)}, r"column 'lane' is also an output column of segment; name segment's otherwise with "
                              r"--output-column lane=NEW_NAME \(or rename"),
    ({"context": ("length",), "output_column": (("length", "steps"),)}, None),
    ({"output_column": (("lane", "key"),)}, r"--output-column: two output columns would be named 'key'"),
    ({"initial_state": ("bad",)}, r"expected NAME=COLUMN"),
    ({"initial_state": ("h=label", "h=weight")}, r"--initial-state 'h=weight': state 'h' is given twice"),
    ({"sequence": ()}, r"--sequence: give at least one sequence \(list\) column"),
    ({"pad_value": ("label=3",)}, r"--pad-value 'label=3': 'label' is not a --sequence column \(sequences: tokens\)"),
    ({"context": ("tokens",)}, r"--context 'tokens': already given as --sequence 'tokens'; each output column"),
])
def test_option_errors(options, message):
    given = {"key": "key", "sequence": ("tokens",), "num_unroll": 2, "batch_size": 2, **options}
    if message is None:
        assert SegmentOptions(**given).names["length"] == "steps"
        return
    with pytest.raises(UsageError, match=message):
        SegmentOptions(**given)


def test_pipeline_keys_are_the_flags(tmp_path):
    """pad-value and initial-state take a table, a list or a string; pad and no-pad are one switch."""
    def stage(keys: str) -> SegmentOptions:
        path = tmp_path / "p.toml"
        path.write_text(f'[input]\npath = "src"\n[[stage]]\nop = "segment"\nkey = "key"\nsequence = "tokens"\n'
                        f'num-unroll = 2\nbatch-size = 2\n{keys}\n[output]\npath = "out"\n')
        return load(str(path)).stages[0].options

    base = SegmentOptions(key="key", sequence=("tokens",), num_unroll=2, batch_size=2)
    assert stage('pad-value = {tokens = -1}\ninitial-state = "h=label"') == \
        replace(base, pad_value=("tokens=-1",), initial_state=("h=label",))
    assert stage('pad-value = ["tokens=1.5"]\nno-pad = false') == replace(base, pad_value=("tokens=1.5",))
    assert stage("pad = false\nworld-size = 2") == replace(base, pad=False, world_size=2)
    for keys, message in [("pad = true\nno-pad = true", "keys 'pad' and 'no-pad' set the same option; give one"),
                          ("no-pad = 1", "key 'no-pad': expected true or false, got integer 1"),
                          ("pad-value = true", "key 'pad-value': expected COL=V pairs, got boolean True"),
                          ("world-size = 0", "key 'world-size' = 0: must be at least 1")]:
        with pytest.raises(UsageError, match=re.escape(f"stage 1 (segment): {message}")):
            stage(keys)


def test_bad_key_and_length_values_name_the_row(tmp_path):
    nulls = table_of([2, 2], keys=["a", None])
    with pytest.raises(InputError, match=r"row 1: column 'key' is null; every example needs a unique key"):
        run(tmp_path, nulls, "a", num_unroll=2, batch_size=1)
    binary = table_of([2, 2]).set_column(0, "key", pa.array([b"a", b"\xff"], pa.binary()))
    with pytest.raises(InputError, match=r"row 0..*row 1: column 'key' holds a key that is not UTF-8 text"):
        run(tmp_path, binary, "b", num_unroll=2, batch_size=1)
    utf8 = table_of([2]).set_column(0, "key", pa.array([b"k"], pa.binary()))
    assert run(tmp_path, utf8, "c", num_unroll=2, batch_size=1)[0].column("key").to_pylist() == ["00000_of_00001:k"]
    with pytest.raises(InputError, match=r"row 1: column 'real' is null"):
        run(tmp_path, table_of([2, 2], real=pa.array([2, None])), "d", num_unroll=2, batch_size=1,
            input_length="real")


def test_a_context_column_named_like_an_output_column_is_refused_by_name(tmp_path):
    with pytest.raises(UsageError, match=r"column 'length' is also an output column of segment; name segment's "
                                         r"otherwise with --output-column length=NEW_NAME, or give yours as "
                                         r"--input-length if it counts real steps, or name the columns to copy with "
                                         r"--context \(or rename yours"):
        run(tmp_path, table_of([2], length=pa.array([1.5])), num_unroll=2, batch_size=1)
    out, manifest = run(tmp_path, table_of([2], length=pa.array([1.5])), "b", num_unroll=2, batch_size=1,
                        context=("label",))
    assert "label" in out.schema.names and manifest["options"]["context"] == ["label"]


def test_an_integer_length_column_is_taken_for_segment_s_only_when_it_holds_the_steps(tmp_path):
    plain, _ = run(tmp_path, table_of([3, 5, 2]), "plain", num_unroll=2, batch_size=2)
    same, manifest = run(tmp_path, table_of([3, 5, 2], length=pa.array([3, 5, 2])), "same", num_unroll=2,
                         batch_size=2)
    assert same.equals(plain) and manifest["options"]["context"] == ["label"]
    with pytest.raises(InputError, match=r"row 1, column 'length': 50 but the sequence has 5 steps; segment writes "
                                         r"its own 'length' column and takes yours only when it holds that on every "
                                         r"row: name segment's otherwise with --output-column length=NEW_NAME, or "
                                         r"give yours as --input-length if it counts real steps"):
        run(tmp_path, table_of([3, 5, 2], length=pa.array([3, 50, 2])), "off", num_unroll=2, batch_size=2)
    assert not (tmp_path / "off").exists()
    renamed, manifest = run(tmp_path, table_of([3, 5, 2], length=pa.array([3, 50, 2])), "renamed", num_unroll=2,
                            batch_size=2, output_column=(("length", "steps"),))
    assert renamed.column("steps").equals(plain.column("length"))
    assert renamed.schema.names == ["key", "next_key", "sequence", "sequence_count", "steps", "total_length",
                                    "insertion_index", "lane", "batch", "label", "length", "tokens"]
    firsts = [r for r in renamed.to_pylist() if r["sequence"] == 0 and r["key"]]
    assert {r["key"]: r["length"] for r in firsts} == {"00000_of_00002:ex0": 3, "00000_of_00003:ex1": 50,
                                                       "00000_of_00001:ex2": 2}
    assert manifest["options"]["output_columns"] == {"length": "steps"}


def test_schema_errors(tmp_path):
    with pytest.raises(SchemaError, match=r"--sequence 'label' is int64: expected a list column"):
        run(tmp_path, table_of([2]), num_unroll=2, batch_size=1, sequence=("label",))
    with pytest.raises(SchemaError, match=r"--key 'label' is int64: expected a string column"):
        run(tmp_path, table_of([2]), "b", key="label", num_unroll=2, batch_size=1, context=())
    with pytest.raises(SchemaError, match=r"--input-length 'label' is double: expected an integer column"):
        run(tmp_path, table_of([2]).set_column(1, "label", pa.array([1.0])), "c", num_unroll=2, batch_size=1,
            input_length="label")


def test_empty_input_gives_an_empty_valid_output(tmp_path):
    out, manifest = run(tmp_path, table_of([]), num_unroll=3, batch_size=4, context=("label",))
    assert out.num_rows == 0 and manifest["stats"]["batches"] == 0 and manifest["stats"]["examples"] == 0
    assert out.schema.names[:9] == ["key", "next_key", "sequence", "sequence_count", "length", "total_length",
                                    "insertion_index", "lane", "batch"]
    assert len(batchtool.load(str(tmp_path / "dst"))) == 0


def test_output_is_the_same_for_any_item_size_and_threads(tmp_path, monkeypatch):
    corpus = make_table(120, seed=9)
    src = write_parquet_shards(str(tmp_path / "src"), corpus, shards=3, row_group_size=11)
    options = SegmentOptions(key="key", sequence=("tokens", "frames"), num_unroll=5, batch_size=6,
                             context=("label",))
    run_operation(SEGMENT, options, src, str(tmp_path / "a"), OutputOptions(), RunSettings(threads=1, quiet=True))
    monkeypatch.setattr(lanes, "ITEM_SEGMENTS", 12)
    run_operation(SEGMENT, options, src, str(tmp_path / "b"), OutputOptions(), RunSettings(threads=4, quiet=True))
    assert read_dir(str(tmp_path / "a")).equals(read_dir(str(tmp_path / "b")))


def test_tfrecord_output_reads_back_the_same(tmp_path):
    corpus = make_table(60, seed=2)
    src = write_parquet_shards(str(tmp_path / "src"), corpus)
    options = SegmentOptions(key="key", sequence=("tokens", "frames"), num_unroll=6, batch_size=4,
                             context=("label", "weight"))
    run_operation(SEGMENT, options, src, str(tmp_path / "pq"), OutputOptions(), QUIET)
    run_operation(SEGMENT, options, src, str(tmp_path / "tf"), OutputOptions(format="tfrecord", shard_rows=40), QUIET)
    a, b = list(batchtool.load(str(tmp_path / "pq"))), list(batchtool.load(str(tmp_path / "tf")))
    assert len(a) == len(b) == len(batchtool.load(str(tmp_path / "tf")))
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])


# --- key hashes ---------------------------------------------------------------

def test_key_hashes_are_deterministic_and_distinguish_close_keys():
    keys = pa.array(["", "a", "b", "ab", "ba", "a" * 100, "a" * 101, "é"])
    h = key_hashes(keys)
    assert len(set(h.tolist())) == len(keys)
    np.testing.assert_array_equal(key_hashes(keys.slice(3)), h[3:])
    np.testing.assert_array_equal(key_hashes(keys.cast(pa.large_string())), h)


def test_dry_run_of_a_segment_stage_counts_segments_from_the_lengths(tmp_path):
    src = tmp_path / "src"
    os.makedirs(src)
    pq.write_table(table_of([45, 3, 0]), src / "part-0.parquet")
    path = tmp_path / "p.toml"
    path.write_text(f'[input]\npath = "{src}"\n[[stage]]\nop = "segment"\nkey = "key"\nsequence = "tokens"\n'
                    'num-unroll = 20\nbatch-size = 2\nworld-size = 2\n[output]\npath = "out"\n')
    stages = run_pipeline(load(str(path)), QUIET, dry_run=True).stages
    # 3 + 1 + 1 segments in lanes of 2 on 2 ranks: 2 batches per rank; 48 real steps in 4 * 2 * 20 slots
    assert stages == [{"stage": 1, "op": "segment", "rows_in": 3, "rows_out": None, "segments": 5, "batches": 4,
                       "padding_efficiency": 0.3}]
    assert not (tmp_path / "out").exists()


def test_cut_gives_compact_batches_with_the_slices_values_and_checksums():
    """segment's batches are views whose buffers hold their own values only (the IPC writer's layout, so encode
    copies none of them), equal to slices of the item's table, with the same CRC32C; a column with nulls or
    booleans is sliced as before. 7 rows in batches of 3: the last batch is short."""
    table = pa.RecordBatch.from_pydict({
        "key": pa.array(["a", "", "ccc", "dd", "", "f", "gggg"]),
        "n": pa.array(np.arange(7, dtype=np.int32)),
        "steps": pa.array([[1, 2], [], [3], [4, 5, 6], [7], [], [8]], pa.list_(pa.int64())),
        "frames": pa.array([[[1.0, 2.0]], [], [[3.0, 4.0], [5.0, 6.0]], [], [[7.0, 8.0]], [[9.0, 0.0]], []],
                           pa.list_(pa.list_(pa.float32(), 2))),
        "blob": pa.array([b"x", b"yy", b"", b"z", b"", b"", b"w"], pa.large_binary()),
        "maybe": pa.array([1.0, None, 3.0, 4.0, 5.0, 6.0, 7.0]),
        "flag": pa.array([True, False, True, True, False, False, True]),
    })
    batches = compact_batches(table, 3)
    assert [b.num_rows for b in batches] == [3, 3, 1]
    for t, batch in enumerate(batches):
        expected = table.slice(3 * t, 3)
        assert batch.equals(expected)
        assert ARROW.encode(batch, None).metadata == ARROW.encode(expected, None).metadata
        for name in ("key", "n", "steps", "frames", "blob"):
            assert batch_check.written_buffers(batch.column(name)) is not None, name
