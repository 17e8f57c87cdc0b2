"""to_numpy's per-schema conversion plan gives exactly the arrays column_to_numpy gives, for every column kind."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.loader.arrays import _Dense, _plan, column_to_numpy, hand_out, to_numpy, views


def assert_same(got: object, want: object, where: str) -> None:
    """Same type, dtype, shape, writability and values (NaN equal to NaN), object arrays element by element."""
    assert type(got) is type(want), where
    if not isinstance(want, np.ndarray):
        assert got == want, where
        return
    assert (got.dtype, got.shape, got.flags.writeable) == (want.dtype, want.shape, want.flags.writeable), where
    if want.dtype == object:
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


class Pair(pa.ExtensionType):
    """An extension type over a fixed-size list of floats (to_numpy converts its storage's way, unplanned)."""

    def __init__(self) -> None:
        super().__init__(pa.list_(pa.float32(), 2), "batchtool.test.pair")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


COLUMNS = {
    "int": pa.array([1, 2, 3, 4], pa.int64()),
    "int8 nulls": pa.array([1, None, 3, 4], pa.int8()),
    "float16": pa.array(np.arange(4, dtype=np.float16)),
    "float nulls": pa.array([1.5, None, None, 4.0], pa.float32()),
    "uint32": pa.array([1, 2, 3, 2**32 - 1], pa.uint32()),
    "bool": pa.array([True, False, True, True]),
    "bool nulls": pa.array([True, None, False, True]),
    "string": pa.array(["a", "bé", "", "d"]),
    "string nulls": pa.array(["a", None, "c", None]),
    "large binary": pa.array([b"a", b"\x00", b"", None], pa.large_binary()),
    "date": pa.array([0, 1, 2, 3], pa.date32()),
    "dictionary": pa.array(["x", "y", "x", "x"]).dictionary_encode(),
    "padded list": pa.array([[1, 2], [3, 4], [5, 6], [7, 8]], pa.list_(pa.int32())),
    "large list": pa.array([[1.0], [2.0], [3.0], [4.0]], pa.large_list(pa.float64())),
    "ragged list": pa.array([[1, 2], [3], [], [4, 5, 6]], pa.list_(pa.int64())),
    "null row": pa.array([[1, 2], None, [3, 4], [5, 6]], pa.list_(pa.int64())),
    "null step": pa.array([[1, None], [3, 4], [5, 6], [7, 8]], pa.list_(pa.float32())),
    "all empty": pa.array([[], [], [], []], pa.list_(pa.int64())),
    "fixed": pa.array([[1, 2, 3]] * 4, pa.list_(pa.int16(), 3)),
    "fixed of nothing": pa.array([[]] * 4, pa.list_(pa.int16(), 0)),
    "steps of vectors": pa.array([[[1.0, 2.0]] * 3] * 4, pa.list_(pa.list_(pa.float32(), 2))),
    "ragged steps of vectors": pa.array([[[1.0, 2.0]], [[3.0, 4.0]] * 2, [], [[5.0, 6.0]]],
                                        pa.list_(pa.list_(pa.float32(), 2))),
    "null vector": pa.array([[[1.0, 2.0]], [None], [[3.0, 4.0]], [[5.0, 6.0]]], pa.list_(pa.list_(pa.float32(), 2))),
    "lists of lists": pa.array([[[1, 2], [3, 4]]] * 4, pa.list_(pa.list_(pa.int64()))),
    "lists of ragged lists": pa.array([[[1, 2], [3]]] * 4, pa.list_(pa.list_(pa.int64()))),
    "lists of strings": pa.array([["a", "b"]] * 4, pa.list_(pa.string())),
    "lists of bools": pa.array([[True, False]] * 4, pa.list_(pa.bool_())),
    "extension": pa.ExtensionArray.from_storage(Pair(), pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float32(), 2))),
}


def ipc_batch(batch: pa.RecordBatch, tmp_path) -> pa.RecordBatch:
    """`batch` as load reads it: a view of a read-only memory map of an Arrow IPC file."""
    path = str(tmp_path / "batch.arrow")
    with pa.ipc.new_file(path, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_file(pa.memory_map(path, "r")).get_batch(0)


def assert_plan_matches(batch: pa.RecordBatch, unsliced: bool = False) -> None:
    """to_numpy's arrays (or with `unsliced`, those views and hand_out make from the batch's buffers, as load
    makes them of Arrow IPC batches) are column_to_numpy's, writable or not."""
    for writable in (False, True):
        got = hand_out(views(batch, writable, unsliced=unsliced), writable, False) if unsliced \
            else to_numpy(batch, writable)
        assert list(got) == batch.schema.names
        for name, column in zip(batch.schema.names, batch.columns):
            assert_same(got[name], column_to_numpy(column, writable), f"{name}, writable={writable}")


def read_back(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` through the Arrow IPC format, in memory: every array at offset 0, no bitmap where no null."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


NULL_FREE = {name: column for name, column in COLUMNS.items() if not column.null_count and "null" not in name}
"""The columns of batch output: no null anywhere, so no validity bitmap once read back."""


@pytest.mark.parametrize("columns", [COLUMNS, NULL_FREE], ids=["with nulls", "null-free"])
@pytest.mark.parametrize("memory", ["decoded", "mapped"])
def test_unsliced_batches_convert_from_their_buffers_as_column_to_numpy_does(columns, memory, tmp_path):
    """load's path for Arrow IPC batches: the null-free batch's columns of numbers are made from its buffers
    flattened (_Plan.flat); a number column with nulls sends the whole batch through the per-column path."""
    batch = pa.RecordBatch.from_pydict(columns)
    batch = ipc_batch(batch, tmp_path) if memory == "mapped" else read_back(batch)
    assert (_plan(batch).flat(batch) is not None) == (columns is NULL_FREE)
    assert_plan_matches(batch, unsliced=True)


@pytest.mark.parametrize("memory", ["decoded", "mapped"])
@pytest.mark.parametrize("cut", [(0, 4), (1, 3), (2, 1), (4, 0)])
def test_every_column_kind_converts_as_column_to_numpy_does(memory, cut, tmp_path):
    batch = pa.RecordBatch.from_pydict(COLUMNS)
    if memory == "mapped":
        batch = ipc_batch(batch, tmp_path)
    assert_plan_matches(batch.slice(*cut))


def test_numbers_and_padded_lists_take_the_planned_path():
    """The columns of batch output (numbers, padded lists, lists of vectors) skip column_to_numpy's per-level
    slicing; the others (strings, booleans, dates, extension types) are left to it."""
    planned = {name for name, column in COLUMNS.items() if _Dense.of(column.type) is not None}
    assert planned == {"int", "int8 nulls", "float16", "float nulls", "uint32", "padded list", "large list",
                       "ragged list", "null row", "null step", "all empty", "fixed", "fixed of nothing",
                       "steps of vectors", "ragged steps of vectors", "null vector", "lists of lists",
                       "lists of ragged lists"}
    dense = _Dense.of(COLUMNS["steps of vectors"].type)
    values = dense._values(COLUMNS["steps of vectors"])
    assert values is not None and values.shape == (4, 3, 2)
    for declined in ("ragged list", "null row", "null step", "null vector", "all empty", "lists of ragged lists"):
        assert _Dense.of(COLUMNS[declined].type)._values(COLUMNS[declined]) is None, declined


def test_views_leave_the_copy_of_mapped_numbers_to_hand_out(tmp_path):
    """What load's reading threads make (views) and its loop hands out (hand_out): writable arrays of a memory-mapped
    batch are copied by hand_out only, into arrays of their own, equal to the views."""
    batch = ipc_batch(pa.RecordBatch.from_pydict(COLUMNS), tmp_path)
    ahead = views(batch, writable=True)
    for name in ("int", "padded list", "steps of vectors"):
        assert not ahead[name].flags.writeable, name
    out = hand_out(ahead, writable=True, tensors=False)
    for name, array in out.items():
        assert array.flags.writeable, name
        if name in ("int", "padded list", "steps of vectors"):
            assert not np.shares_memory(array, ahead[name]) and array.tolist() == ahead[name].tolist(), name
    assert hand_out(views(batch, writable=False), writable=False, tensors=False)["int"].flags.writeable is False


def test_a_list_child_with_its_own_offset():
    """A list whose values array is itself a slice (offset into its buffers): the plan adds that offset."""
    child = pa.array(np.arange(20, dtype=np.int64)).slice(3, 12)
    column = pa.ListArray.from_arrays(pa.array([0, 3, 6, 9, 12], pa.int32()), child)
    fixed = pa.FixedSizeListArray.from_arrays(child, 3)
    batch = pa.RecordBatch.from_arrays([column, fixed], ["list", "fixed"])
    arrays = to_numpy(batch)
    assert arrays["list"].tolist() == arrays["fixed"].tolist() == np.arange(3, 15).reshape(4, 3).tolist()
    assert_plan_matches(batch)
    assert_plan_matches(batch.slice(1, 2))


def test_batches_of_different_schemas_each_get_their_own_plan():
    ints = pa.RecordBatch.from_pydict({"x": pa.array([[1, 2]], pa.list_(pa.int64()))})
    strings = pa.RecordBatch.from_pydict({"x": pa.array(["a"])})
    for _ in range(2):
        assert to_numpy(ints)["x"].shape == (1, 2) and to_numpy(strings)["x"].tolist() == ["a"]


LEAVES = st.sampled_from([pa.int8(), pa.int32(), pa.uint16(), pa.int64(), pa.float32(), pa.float64()])


@st.composite
def list_types(draw) -> pa.DataType:
    kind = draw(LEAVES)
    for _ in range(draw(st.integers(0, 3))):
        size = draw(st.one_of(st.none(), st.integers(0, 3)))
        kind = (draw(st.sampled_from([pa.list_, pa.large_list]))(kind) if size is None
                else pa.list_(kind, size))
    return kind


@st.composite
def values_of(draw, kind: pa.DataType, rows: int, padded: bool) -> list:
    """`rows` values of `kind`: lists of one length per level where `padded` (mostly), nulls now and then."""
    def one(kind: pa.DataType, length: int | None) -> object:
        if draw(st.integers(0, 15)) == 0:
            return None
        if not pa.types.is_list(kind) and not pa.types.is_large_list(kind) and not pa.types.is_fixed_size_list(kind):
            return draw(st.integers(0, 100))
        steps = kind.list_size if pa.types.is_fixed_size_list(kind) else (
            length if length is not None else draw(st.integers(0, 3)))
        inner = draw(st.integers(1, 3)) if padded else None
        return [one(kind.value_type, inner) for _ in range(steps)]

    length = draw(st.integers(1, 3)) if padded else None
    return [one(kind, length) for _ in range(rows)]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), kind=list_types(), rows=st.integers(0, 5), padded=st.booleans())
def test_any_nesting_of_lists_converts_as_column_to_numpy_does(data, kind, rows, padded):
    column = pa.array(data.draw(values_of(kind, rows, padded)), kind)
    start = data.draw(st.integers(0, rows))
    batch = pa.RecordBatch.from_arrays([column], ["x"]).slice(start, data.draw(st.integers(0, rows - start)))
    assert_plan_matches(batch)
    assert_plan_matches(read_back(batch), unsliced=True)
