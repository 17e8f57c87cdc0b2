"""Padding list columns: exact values, any element type, pad values parsed per column type."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.errors import SchemaError, UsageError
from batchtool.padding import mask_column, pad_batch, parse_pad_values, sequence_lengths


@given(st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=6)), max_size=12),
       st.integers(0, 3), st.integers(-9, 9))
@settings(max_examples=80, deadline=None)
def test_padding_matches_a_python_reference(rows, extra, pad):
    arr = pa.array(rows, pa.list_(pa.int32()))
    length = max((len(r) for r in rows if r), default=0) + extra
    for offset in (0, min(1, len(rows))):  # sliced arrays too
        got = pad_batch(pa.record_batch({"x": arr.slice(offset)}), ["x"], length, {"x": pad}).column(0)
        want = [(r or []) + [pad] * (length - len(r or [])) for r in rows[offset:]]
        assert got.to_pylist() == want


def test_strings_and_nested_vectors_pad_with_empty_and_zero():
    batch = pa.record_batch({
        "w": pa.array([["a"], ["b", "c"]]),
        "f": pa.array([[[1.0, 2.0]], []], pa.list_(pa.list_(pa.float32(), 2))),
    })
    out = pad_batch(batch, ["w", "f"], 2, {})
    assert out.column("w").to_pylist() == [["a", ""], ["b", "c"]]
    assert out.column("f").to_pylist() == [[[1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]
    assert out.schema.field("f").type == pa.list_(pa.list_(pa.float32(), 2))


def test_mask_marks_real_steps():
    assert mask_column([2, 0], 3).to_pylist() == [[True, True, False], [False, False, False]]


def test_pad_values_are_parsed_per_column_type():
    schema = pa.schema([("t", pa.list_(pa.int64())), ("f", pa.list_(pa.float32())), ("s", pa.list_(pa.string()))])
    assert parse_pad_values(["t=-1", "f=0.5", "s=<pad>"], schema) == {"t": -1, "f": 0.5, "s": "<pad>"}
    with pytest.raises(UsageError, match="'x' is not a int64 value"):
        parse_pad_values(["t=x"], schema)
    with pytest.raises(UsageError, match="no column 'q'"):
        parse_pad_values(["q=1"], schema)


def test_disagreeing_sequence_columns_name_the_row():
    batch = pa.record_batch({"a": pa.array([[1], [1, 2]]), "b": pa.array([[1], [1]])})
    with pytest.raises(SchemaError, match=r"row 1: sequence columns disagree in length: 'a' has 2 steps, 'b' has 1"):
        sequence_lengths(batch, ["a", "b"], lambda i: f"file.parquet, row {i}")
