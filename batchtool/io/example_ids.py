"""The input example ids (core.rng.example_ids) an op's output batches carry to the writer, which keeps them for the
example index (batchtool.io.example_index) and takes them off before a byte is written: one trailing column, the ids
of a row's examples (one a row, or a list a row where a row packs several), so they travel wherever a batch does
(a run read on a worker, a spool file) and the data files never hold them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

ID_COLUMN = "__batchtool_examples"
"""The carried column's name; found by position (last, one beyond the stored schema), so a user's column of the same
name is never mistaken for it."""


def carry(batch: pa.RecordBatch, ids: np.ndarray, firsts: np.ndarray | None = None) -> pa.RecordBatch:
    """`batch` with its examples' ids as its last column: one a row, or with `firsts` (each row's first example in
    `ids`, and len(ids) last) the examples of each row."""
    column = pa.array(np.asarray(ids, dtype=np.uint64), pa.uint64())
    if firsts is not None:
        column = pa.ListArray.from_arrays(pa.array(np.asarray(firsts, dtype=np.int32)), column)
    return batch.append_column(ID_COLUMN, column)


def taken(batch: pa.RecordBatch, width: int) -> tuple[pa.RecordBatch, np.ndarray | None]:
    """A batch as made, as it is stored (its first `width` columns) and the ids of its examples in order (None: it
    carries none)."""
    if batch.num_columns == width:
        return batch, None
    column = batch.column(width)
    if pa.types.is_list(column.type):
        column = column.flatten()
    return batch.select(list(range(width))), column.to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)


__all__ = ["ID_COLUMN", "carry", "taken"]
