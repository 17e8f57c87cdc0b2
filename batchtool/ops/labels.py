"""Class labels: an integer column read as class indices, and errors naming the bad ones (stratify, bucket)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batchtool.core.errors import PartialError, SchemaError, where
from batchtool.ops.base import Context, Scan

if TYPE_CHECKING:  # arrays are imported where the functions run: options declared from here make --help
    import numpy as np

    from batchtool.io import stats as stats_mod
    from batchtool.io.dataset import Chunk

MAX_CLASSES = 1 << 16
"""Most classes, given (--num-classes, --target) or inferred from the data: every input chunk counts its
labels in an array of one entry per class."""
Locate = Callable[[int], str]


class LabelError(PartialError):
    """Labels that are null, not integers, or outside [0, num_classes): how many and the first one. Found while
    streaming (no counting pass: stratify's --init-probs, --mode online), it becomes the error over the whole
    input: every bad label counted, the first one named."""

    def __init__(self, column: str, num_classes: int, count: int, first: str) -> None:
        self.column, self.num_classes, self.first = column, num_classes, first
        super().__init__(f"column {column!r}: {count:,} label(s) are not integers in [0, {num_classes}) "
                         f"(first: {first})")

    def over_input(self, scan: Scan, locate: Locate) -> LabelError:
        return full_label_error(scan, self.column, self.num_classes, locate)


def check_label_type(context: Context, column: str) -> None:
    """Labels must be integers (or floats holding them): checked on the schema, before any label is counted."""
    import pyarrow as pa

    t = context.schema.field(column).type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        path = context.first_file or context.src
        raise SchemaError(f"{where(path, column=column)}: type {t}, but labels must be integers in [0, num_classes)")


def label_codes(chunk: Chunk, column: str, num_classes: int, locate: Locate) -> np.ndarray:
    """Labels as int64 class indices; a null, fractional or out-of-range label raises LabelError."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = chunk.data.column(column)
    values = pc.fill_null(pc.cast(arr, pa.float64()), math.nan).to_numpy(zero_copy_only=False)
    if pa.types.is_integer(arr.type):
        codes = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = (codes < 0) | (codes >= num_classes) | np.isnan(values)
    else:
        bad = ~(np.isfinite(values) & (values == np.floor(values)) & (values >= 0) & (values < num_classes))
        codes = np.where(bad, 0, values).astype(np.int64)
    if bad.any():
        i = int(np.argmax(bad))
        value = arr[i].as_py() if arr[i].is_valid else "null"
        raise LabelError(column, num_classes, int(bad.sum()), f"{locate(chunk.ids[i])}: {value}")
    return codes


def is_class(value: Any, num_classes: int) -> bool:
    return isinstance(value, (int, float)) and float(value).is_integer() and 0 <= value < num_classes


def _first_bad(column: str, num_classes: int, locate: Locate, chunk: Chunk) -> str | None:
    try:
        label_codes(chunk, column, num_classes, locate)
    except LabelError as exc:
        return exc.first
    return None


def bad_label_count(counted: stats_mod.DatasetStats, num_classes: int) -> int:
    """Labels that are null or not a class, from a counting pass."""
    return counted.label_nulls + sum(n for v, n in counted.label_counts.items() if not is_class(v, num_classes))


def full_label_error(scan: Scan, column: str, num_classes: int, locate: Locate,
                     counted: stats_mod.DatasetStats | None = None) -> LabelError:
    """The error over the whole dataset: how many labels are bad (counting pass) and the first one."""
    from batchtool.io import stats as stats_mod

    if counted is None:
        counted = stats_mod.DatasetStats()
        for part in scan([column], functools.partial(stats_mod.chunk_stats, label=column, length=None)):
            counted.merge(part)
    for first in scan([column], functools.partial(_first_bad, column, num_classes, locate)):
        if first is not None:
            return LabelError(column, num_classes, bad_label_count(counted, num_classes), first)
    raise AssertionError("the counting pass saw bad labels that the scan did not find")


__all__ = ["LabelError", "MAX_CLASSES", "bad_label_count", "check_label_type", "full_label_error", "is_class",
           "label_codes"]
