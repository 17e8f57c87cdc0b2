"""pack --segment-multiple M and --max-segments K: rows assembled exactly (pieces padded to multiples of M, their
segment ids and positions running on, cu_seqlens K + 1 long with a repeated tail), every example once and in order
whatever the lengths, the slots' real lengths read back from the plan, the CLI's errors, bytes and inspect."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchtool
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.ops.base import OptionError
from batchtool.ops.pack import PackOptions
from batchtool.ops.pack.options import PackColumns, output_schema
from batchtool.ops.pack.rows import assemble
from batchtool.ops.pack.segments import Spans
from conftest import REPO, data_bytes, read_dir, write_parquet_shards
from test_pack import run_pack, table_of


def assembled(lengths: list[int], rows: list[int], pad_length: int, multiple: int, max_segments: int | None,
              unpadded: bool = True) -> list[dict]:
    """assemble() over items of `lengths` (tokens 1, 2, ...) in `rows`, read back as dicts."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.arange(offsets[-1], dtype=np.int64) + 1))
    items = pa.RecordBatch.from_arrays([tokens, pa.array([f"k{i}" for i in range(len(lengths))])],
                                       names=["tokens", "key"])
    options = PackOptions(max_length=pad_length, segment_multiple=multiple if unpadded else None,
                          max_segments=max_segments)
    columns = PackColumns(("tokens",), ("key",), names=options.names)
    schema = output_schema(items.schema, columns, options)
    batch = assemble(items, np.asarray(rows), 0, pad_length, schema, ("tokens",), {"tokens": -1}, options.names,
                     multiple, max_segments)
    return batch.to_pylist()


def test_pieces_span_multiples_of_m_and_cu_seqlens_has_k_plus_1_offsets():
    """M = 4, K = 3: a row of pieces of 3 and 5 steps spans 4 + 8; padded to 16. The padding inside a piece keeps its
    segment id and its positions run on (as Megatron-Bridge's packed sequences have them); after the last piece,
    segment 0. cu_seqlens holds the spans' offsets, cu_seqlens_unpadded the real lengths' sums, each 4 long."""
    row, other = assembled([3, 5, 2], [0, 0, 1], 16, 4, 3)
    assert row["tokens"] == [1, 2, 3, -1, 4, 5, 6, 7, 8, -1, -1, -1, -1, -1, -1, -1]
    assert row["segment_ids"] == [1] * 4 + [2] * 8 + [0] * 4
    assert row["positions"] == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0]
    assert row["cu_seqlens"] == [0, 4, 12, 12] and row["cu_seqlens_unpadded"] == [0, 3, 8, 8]
    assert (row["num_examples"], row["length"], row["key"]) == (2, 8, ["k0", "k1"])
    assert other["tokens"][:4] == [9, 10, -1, -1] and other["cu_seqlens"] == [0, 4, 4, 4]
    assert other["cu_seqlens_unpadded"] == [0, 2, 2, 2] and other["segment_ids"][:5] == [1, 1, 1, 1, 0]


def test_pieces_of_strings_with_nulls_pad_with_their_pad_value():
    """A sequence column that is not numbers (strings, a null step kept) is spread the same way."""
    words = pa.array([["a", None, "b"], ["c", "d", "e", "f", "g"]], type=pa.list_(pa.string()))
    items = pa.RecordBatch.from_arrays([words], names=["words"])
    options = PackOptions(max_length=16, segment_multiple=4)
    schema = output_schema(items.schema, PackColumns(("words",), (), names=options.names), options)
    row, = assemble(items, np.zeros(2, np.int64), 0, 12, schema, ("words",), {"words": "_"}, options.names, 4
                    ).to_pylist()
    assert row["words"] == ["a", None, "b", "_", "c", "d", "e", "f", "g", "_", "_", "_"]
    assert row["cu_seqlens"] == [0, 4, 12] and row["cu_seqlens_unpadded"] == [0, 3, 8] and row["length"] == 8


def test_without_the_options_rows_are_as_before():
    """M = 1 and no K: cu_seqlens of n + 1 offsets, no cu_seqlens_unpadded, no padding inside a row."""
    row, = assembled([3, 0, 2], [0, 0, 0], 6, 1, None, unpadded=False)
    assert row["tokens"] == [1, 2, 3, 4, 5, -1] and row["cu_seqlens"] == [0, 3, 3, 5]
    assert row["segment_ids"] == [1, 1, 1, 3, 3, 0] and "cu_seqlens_unpadded" not in row


def test_spans_rank_each_length_within_its_span_and_read_real_lengths_back():
    """Pieces of 1, 1, 3, 4, 5 steps with M = 4: spans 4 (four pieces) and 8 (one); within span 4 the 1-step pieces
    take ranks 0-1, the 3-step one 2, the 4-step one 3. All slots of a span hold its real steps."""
    spans = Spans.of(np.bincount([1, 1, 3, 4, 5]), 4)
    assert spans.counts.tolist() == [0, 0, 0, 0, 4, 0, 0, 0, 1]
    assert spans.first[[1, 3, 4, 5]].tolist() == [0, 2, 3, 0]
    assert spans.real_steps_in(4, range(4), seed=3) == 9 and spans.real_steps_in(8, range(1), seed=3) == 5
    singles = [spans.real_steps_in(4, range(i, i + 1), seed=3) for i in range(4)]
    assert sorted(singles) == [1, 1, 3, 4]
    span, slot = spans.slots(np.array([3, 1, 1, 4]), np.array([0, 0, 1, 0]), seed=3)
    assert span.tolist() == [4, 4, 4, 4] and sorted(slot.tolist()) == [0, 1, 2, 3]
    assert [singles[s] for s in slot.tolist()] == [3, 1, 1, 4]


@pytest.mark.parametrize("given, message", [
    ({"segment_multiple": 0}, "must be at least 1"),
    ({"max_length": 100, "segment_multiple": 8}, "--max-length 100: must be a multiple of --segment-multiple 8"),
    ({"max_segments": 0}, "must be between 1 and --max-length (64)"),
    ({"max_segments": 65}, "--max-segments 65: must be between 1 and --max-length (64)"),
    ({"max_segments": 4, "max_examples_per_row": 4}, "give at most one of --max-examples-per-row and"),
])
def test_options_refuse_bad_values(given, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        PackOptions(**{"max_length": 64, **given})


def unpack_segments(dst: str, M: int, K: int | None, L: int) -> dict[str, list]:
    """Every packed piece as {key: [(tokens, source_offset), ...]}, checking each row's spans, padding, ids and
    offsets on the way."""
    out: dict[str, list] = {}
    for row in read_dir(dst).to_pylist():
        n, cu, real = row["num_examples"], row["cu_seqlens"], row["cu_seqlens_unpadded"]
        assert len(cu) == len(real) == (n + 1 if K is None else K + 1) and n <= (K or L)
        assert cu[n:] == [cu[n]] * len(cu[n:]) and real[n:] == [real[n]] * len(real[n:])
        assert cu[0] == real[0] == 0 and all(c % M == 0 for c in cu) and cu[-1] <= L and row["length"] == real[n]
        tail = len(row["tokens"]) - cu[n]
        assert row["segment_ids"] == [i + 1 for i in range(n) for _ in range(cu[i], cu[i + 1])] + [0] * tail
        assert row["positions"] == [t for i in range(n) for t in range(cu[i + 1] - cu[i])] + [0] * tail
        for i, key in enumerate(row["key"]):
            steps = real[i + 1] - real[i]
            assert cu[i + 1] - cu[i] == -(-steps // M) * M  # the smallest multiple of M holding the piece
            piece, frames = row["tokens"][cu[i]:cu[i + 1]], row["frames"][cu[i]:cu[i + 1]]
            assert piece[steps:] == [0] * (len(piece) - steps) and frames[steps:] == [[0.0, 0.0]] * (len(piece) - steps)
            out.setdefault(key, []).append((piece[:steps], row["source_offset"][i], frames[:steps]))
    return out


@given(st.lists(st.integers(0, 40), min_size=1, max_size=50), st.sampled_from([1, 2, 3, 8]), st.integers(1, 5),
       st.none() | st.integers(1, 5), st.integers(0, 3), st.none() | st.integers(1, 3))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_example_once_in_order_in_pieces_spanning_multiples_of_m(tmp_path_factory, lengths, M, rows_of_m, K,
                                                                       seed, world_size):
    L = M * rows_of_m * 4
    K = None if K is None else min(K, L)
    base = tmp_path_factory.mktemp("segments")
    table = table_of(lengths)
    src = write_parquet_shards(str(base / "src"), table, shards=2, row_group_size=7)
    stats = run_pack(src, str(base / "out"), seed, max_length=L, segment_multiple=M, max_segments=K, long="split",
                     world_size=world_size, batch_size=2)["stats"]
    packed = unpack_segments(str(base / "out"), M, K, L)
    rows = read_dir(str(base / "out"))
    want = {r["key"]: (r["tokens"], r["frames"]) for r in table.to_pylist()}
    if world_size is None:
        assert set(packed) == set(want)
    for key, pieces in packed.items():
        pieces.sort(key=lambda p: p[1])
        assert all(p[0] == want[key][0][p[1]:p[1] + len(p[0])] for p in pieces)  # each piece where it was cut
        assert all(p[2] == want[key][1][p[1]:p[1] + len(p[0])] for p in pieces)
        offsets = [p[1] for p in pieces]
        assert len(set(offsets)) == len(offsets) and all(o % L == 0 for o in offsets)
        if world_size is None:  # else the remainder's pieces are dropped (and counted)
            assert offsets == [i * L for i in range(len(pieces))] and sum((p[0] for p in pieces), []) == want[key][0]
    real = sum(rows.column("length").to_pylist())
    spans = sum(c[-1] for c in rows.column("cu_seqlens").to_pylist())
    assert stats["real_steps"] == real and stats["segment_padding_steps"] == spans - real
    assert stats["packing_efficiency"] == (round(real / (rows.num_rows * L), 6) if rows.num_rows else None)
    assert stats["examples_packed"] == sum(rows.column("num_examples").to_pylist())
    assert stats["examples_packed"] + stats["examples_dropped"].get("remainder", 0) == sum(
        max(1, -(-n // L)) for n in lengths)


def manifest(path) -> dict:
    with open(os.path.join(path, MANIFEST_NAME)) as f:
        return json.load(f)


def test_cli_threads_and_world_size_give_the_same_bytes_and_inspect_reads_real_lengths(tmp_path, parquet_src,
                                                                                       run_cli):
    args = ["--max-length", "256", "--sequence", "tokens", "--columns", "key", "--segment-multiple", "8",
            "--max-segments", "12", "--split-long", "-q"]
    assert run_cli("pack", parquet_src, tmp_path / "a", *args, "--threads", "1").exit_code == 0
    assert run_cli("pack", parquet_src, tmp_path / "b", *args, "--threads", "2", "--memory", "64MB").exit_code == 0
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))
    m = manifest(tmp_path / "a")
    assert m["options"]["segment_multiple"] == 8 and m["options"]["max_segments"] == 12
    table = read_dir(str(tmp_path / "a"))
    assert {len(c) for c in table.column("cu_seqlens").to_pylist()} == {13}
    inspected = json.loads(run_cli("inspect", tmp_path / "a", "--json").stdout)
    real = [b - a for row, n in zip(table.column("cu_seqlens_unpadded").to_pylist(),
                                     table.column("num_examples").to_pylist()) for a, b in zip(row[:n], row[1:n + 1])]
    assert inspected["example_length"]["count"] == len(real) == m["stats"]["examples_packed"]
    assert inspected["example_length"]["max"] == max(real) and inspected["example_length"]["min"] == min(real)
    assert inspected["example_length"]["column"].startswith("cu_seqlens_unpadded")
    assert inspected["length"]["max"] == max(table.column("length").to_pylist())
    ranked = ["--world-size", "2", "--batch-size", "2"]
    assert run_cli("pack", parquet_src, tmp_path / "c", *args, *ranked, "--threads", "1").exit_code == 0
    assert run_cli("pack", parquet_src, tmp_path / "d", *args, *ranked, "--threads", "2").exit_code == 0
    assert data_bytes(str(tmp_path / "c")) == data_bytes(str(tmp_path / "d"))
    stats = manifest(tmp_path / "c")["stats"]
    assert stats["real_steps"] == sum(read_dir(str(tmp_path / "c")).column("length").to_pylist())


def test_inspect_skips_the_repeated_offsets_of_max_segments(tmp_path, parquet_src, run_cli):
    """Without --segment-multiple, cu_seqlens is K + 1 long: its repeated tail is no 0-step example."""
    assert run_cli("pack", parquet_src, tmp_path / "a", "--max-length", "512", "--sequence", "tokens",
                   "--max-segments", "40", "-q").exit_code == 0
    table = read_dir(str(tmp_path / "a"))
    assert "cu_seqlens_unpadded" not in table.schema.names
    inspected = json.loads(run_cli("inspect", tmp_path / "a", "--json").stdout)
    assert inspected["example_length"]["count"] == sum(table.column("num_examples").to_pylist())
    assert inspected["example_length"]["min"] >= 1  # the sample data has no empty example


@pytest.mark.parametrize("args, message", [
    (["--segment-multiple", "0"], "error: --segment-multiple 0: must be at least 1"),
    (["--segment-multiple", "3"], "error: --max-length 512: must be a multiple of --segment-multiple 3"),
    (["--max-segments", "0"], "error: --max-segments 0: must be between 1 and --max-length (512)"),
    (["--max-segments", "4", "--max-examples-per-row", "4"], "give at most one of --max-examples-per-row and "
                                                              "--max-segments"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, parquet_src, run_cli, args, message):
    result = run_cli("pack", parquet_src, tmp_path / "dst", "--max-length", "512", "--sequence", "tokens", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "dst").exists()


def test_the_documented_example_on_the_sample_data(tmp_path, run_cli):
    """docs/pack.md, context parallelism and CUDA graphs: its figures, offsets and loss mask."""
    dst = tmp_path / "packed_cp"
    result = run_cli("pack", os.path.join(REPO, "sample_data", "parquet"), dst, "--max-length", "512", "--sequence",
                     "tokens", "--columns", "key,label", "--segment-multiple", "8", "--max-segments", "16")
    assert result.exit_code == 0 and "352 packed rows (lower bound 351), packing efficiency 91.75%" in result.output
    assert "13,912 steps of padding inside pieces" in result.output, result.output
    batch = next(iter(batchtool.load(str(dst), shuffle=False)))
    assert batch["cu_seqlens"].shape == (8, 17)
    assert batch["cu_seqlens"][0].tolist() == [0, 40, 56, 88, 272, 344, 392, 416, 440, 456, 464] + [512] * 6
    assert batch["cu_seqlens_unpadded"][0].tolist() == [0, 40, 53, 79, 259, 331, 372, 392, 415, 430, 438] + [482] * 6
    real = np.diff(batch["cu_seqlens_unpadded"], axis=1)
    seg = batch["segment_ids"]
    loss_mask = (seg > 0) & (batch["positions"] < np.take_along_axis(real, np.maximum(seg - 1, 0), axis=1))
    assert loss_mask.sum(axis=1).tolist() == batch["length"].tolist()
    assert (batch["tokens"][~loss_mask] == 0).all()
