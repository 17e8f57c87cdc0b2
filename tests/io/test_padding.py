"""Padding list columns: exact values, any element type, pad values parsed per column type."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.errors import SchemaError, UsageError
from batchtool.io import padding
from batchtool.io.padding import (mask_column, pad_batch, pad_list_column, padded_list, parse_pad_values,
                               sequence_lengths)


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


@pytest.mark.parametrize("spec, message", [("b=300", "--pad-value 'b=300': '300' is out of the range of int8"),
                                           ("t=99999999999999999999", "'99999999999999999999' is out of the range of "
                                                                      "int64")])
def test_a_pad_value_out_of_its_column_s_range_is_an_option_error(spec, message):
    """Not an OverflowError when the batch is padded: refused where the option is read."""
    schema = pa.schema([("t", pa.list_(pa.int64())), ("b", pa.list_(pa.int8()))])
    with pytest.raises(UsageError) as caught:
        parse_pad_values([spec], schema)
    assert message in str(caught.value)
    assert parse_pad_values(["b=-128"], schema) == {"b": -128}


def test_disagreeing_sequence_columns_name_the_row():
    batch = pa.record_batch({"a": pa.array([[1], [1, 2]]), "b": pa.array([[1], [1]])})
    with pytest.raises(SchemaError, match=r"row 1: sequence columns disagree in length: 'a' has 2 steps, 'b' has 1"):
        sequence_lengths(batch, ["a", "b"], lambda i: f"file.parquet, row {i}")


LEAF_TYPES = [pa.int32(), pa.float32(), pa.string()]


@st.composite
def ragged_sources(draw):
    """Several list columns' values (of one element type, maybe fixed-size vectors, maybe with null values),
    and rows that each take a run of steps from one of them."""
    leaf = draw(st.sampled_from(LEAF_TYPES))
    width = draw(st.sampled_from([None, 1, 3]))
    nulls = draw(st.booleans())
    scalar = (st.text(max_size=2) if leaf == pa.string() else st.integers(-9, 9))
    element = st.one_of(st.none(), scalar) if nulls else scalar
    step = element if width is None else st.lists(element, min_size=width, max_size=width)
    if nulls and width is not None:
        step = st.one_of(st.none(), step)  # a null vector
    step_type = leaf if width is None else pa.list_(leaf, width)
    sources = [pa.array(draw(st.lists(step, max_size=8)), step_type).slice(draw(st.integers(0, 1)))
               for _ in range(draw(st.integers(1, 3)))]
    length = draw(st.integers(0, 4))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        s = draw(st.integers(0, len(sources) - 1))
        start = draw(st.integers(0, len(sources[s])))
        rows.append((s, start, draw(st.integers(0, min(length, len(sources[s]) - start)))))
    pad = "" if leaf == pa.string() else draw(st.integers(-3, 3))
    return sources, rows, length, pad


@given(ragged_sources())
@settings(max_examples=150, deadline=None)
def test_padded_list_matches_a_per_row_reference(case):
    """Numbers written through the mask of real steps (rows one after another in one source, or gathered) and
    Arrow's take (nulls, strings)."""
    sources, rows, length, pad = case
    got = padded_list(sources, np.array([r[0] for r in rows], dtype=np.int64),
                      np.array([r[1] for r in rows], dtype=np.int64), np.array([r[2] for r in rows], dtype=np.int64),
                      length, pad, pa.field("item", sources[0].type))
    width = sources[0].type.list_size if pa.types.is_fixed_size_list(sources[0].type) else None
    pad_step = pad if width is None else [pad] * width
    want = [sources[s].to_pylist()[start:start + n] + [pad_step] * (length - n) for s, start, n in rows]
    assert got.to_pylist() == want
    assert got.type == pa.list_(sources[0].type)


@given(st.lists(st.one_of(st.none(), st.lists(st.lists(st.floats(-9, 9, width=32), min_size=2, max_size=2),
                                              max_size=5)), max_size=10), st.integers(0, 2))
@settings(max_examples=80, deadline=None)
def test_padding_vectors_matches_a_python_reference(rows, extra):
    arr = pa.array(rows, pa.list_(pa.list_(pa.float32(), 2)))
    length = max((len(r) for r in rows if r), default=0) + extra
    for offset in (0, min(1, len(rows))):
        got = pad_list_column(arr.slice(offset), length, -1.0)
        assert got.to_pylist() == [(r or []) + [[-1.0, -1.0]] * (length - len(r or [])) for r in rows[offset:]]


def test_a_null_vector_step_stays_null():
    arr = pa.array([[[1.0, 2.0], None], [[5.0, 6.0]]], pa.list_(pa.list_(pa.float32(), 2)))
    assert pad_list_column(arr, 3, -1.0).to_pylist() == [[[1.0, 2.0], None, [-1.0, -1.0]],
                                                          [[5.0, 6.0], [-1.0, -1.0], [-1.0, -1.0]]]


def test_a_step_that_is_a_variable_length_list_pads_with_an_empty_list():
    """list<list<int64>> with a null step and a null row: padding steps hold no values (0 would not be a step)."""
    arr = pa.array([[[1, 2], None, [3]], [[4]], None], type=pa.list_(pa.list_(pa.int64())))
    padded = pad_list_column(arr, 3, 0)
    assert padded.to_pylist() == [[[1, 2], None, [3]], [[4], [], []], [[], [], []]]


@st.composite
def numeric_batches(draw, sign):
    """padded_list's arguments for numbers without nulls (the path that uses working arrays): values of `sign`
    and a pad value of its own, so two batches of opposite signs differ at every step."""
    width = draw(st.sampled_from([None, 3]))
    scalar = st.integers(1, 9).map(lambda v: sign * v)
    step = scalar if width is None else st.lists(scalar, min_size=width, max_size=width)
    step_type = pa.int32() if width is None else pa.list_(pa.int32(), width)
    sources = [pa.array(draw(st.lists(step, min_size=1, max_size=8)), step_type) for _ in range(draw(st.integers(1, 3)))]
    length = draw(st.integers(1, 4))
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        s = draw(st.integers(0, len(sources) - 1))
        start = draw(st.integers(0, len(sources[s]) - 1))
        rows.append((s, start, draw(st.integers(0, min(length, len(sources[s]) - start)))))
    columns = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    return sources, columns, length, sign * 100


@given(numeric_batches(1), numeric_batches(-1))
@settings(max_examples=60, deadline=None)
def test_a_batch_padded_earlier_is_not_changed_by_a_later_one(first, later):
    """Padding's working arrays are reused from batch to batch on a thread; what it hands out never is: the
    arrays (and NumPy views of them) of an earlier batch keep their values after a later batch is padded."""
    def pad(case):
        sources, columns, length, value = case
        return padded_list(sources, *columns, length, value, pa.field("item", sources[0].type))

    kept = pad(first)
    want = kept.to_pylist()
    leaves = kept.flatten()
    while pa.types.is_fixed_size_list(leaves.type):
        leaves = leaves.flatten()
    view = leaves.to_numpy()
    seen = view.copy()
    lengths = first[1][2]
    mask = mask_column(lengths, first[2])
    pad(later)
    mask_column(np.full(len(lengths), later[2]), later[2])
    assert kept.to_pylist() == want
    assert (view == seen).all()
    assert mask.to_pylist() == [[i < n for i in range(first[2])] for n in lengths]


def test_working_arrays_are_kept_up_to_their_bound(monkeypatch):
    """A thread keeps its working arrays between batches only up to PAD_SCRATCH_BYTES: a batch needing more gets
    arrays of its own, and the kept one stays the size it was."""
    monkeypatch.setattr(padding, "PAD_SCRATCH_BYTES", 1 << 16)
    small = padding.scratch("test", 1000, np.int64)
    again = padding.scratch("test", 500, np.int64)
    assert np.shares_memory(small, again)
    big = padding.scratch("test", 1 << 14, np.int64)
    assert big.nbytes == 1 << 17 and not np.shares_memory(big, padding.scratch("test", 1000, np.int64))
    assert np.shares_memory(small, padding.scratch("test", 1000, np.int64))
