"""Hypothesis strategies shared by the tests: small Arrow batches of every column shape batchtool handles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
from hypothesis import strategies as st

LEAVES = {
    "int64": (pa.int64(), st.integers(-(1 << 63), (1 << 63) - 1)),
    "int32": (pa.int32(), st.integers(-(1 << 31), (1 << 31) - 1)),
    "uint16": (pa.uint16(), st.integers(0, (1 << 16) - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "float32": (pa.float32(), st.floats(width=32, allow_nan=False)),
    "float64": (pa.float64(), st.floats(allow_nan=False)),
    "string": (pa.string(), st.text(max_size=5)),
    "binary": (pa.binary(), st.binary(max_size=5)),
}
"""Leaf types and their values: Arrow's type and a strategy for one value."""
SHAPES = ("scalar", "list", "nested", "fixed")
"""A scalar, a list, a list of lists, a list of fixed-size lists."""


@st.composite
def record_batches(draw: st.DrawFn, *, leaves: Mapping[str, tuple] = LEAVES, shapes: Sequence[str] = SHAPES,
                   max_columns: int = 4) -> pa.RecordBatch:
    """0-5 rows of 1..max_columns columns c0, c1, ... (none a prefix of another), nulls included."""
    rows = draw(st.integers(0, 5))
    columns = {}
    for i in range(draw(st.integers(1, max_columns))):
        leaf, values = leaves[draw(st.sampled_from(sorted(leaves)))]
        shape = draw(st.sampled_from(list(shapes)))
        size = draw(st.integers(1, 3))
        step = {"scalar": values, "list": values, "nested": st.lists(values, max_size=3),
                "fixed": st.lists(values, min_size=size, max_size=size)}[shape]
        cell = step if shape == "scalar" else st.lists(step, max_size=4)
        t = {"scalar": leaf, "list": pa.list_(leaf), "nested": pa.list_(pa.list_(leaf)),
             "fixed": pa.list_(pa.list_(leaf, size))}[shape]
        columns[f"c{i}"] = pa.array(draw(st.lists(st.one_of(st.none(), cell), min_size=rows, max_size=rows)), t)
    return pa.record_batch(columns)
