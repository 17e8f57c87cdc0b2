"""The memory budget of keyed orders (key ranges and the map tasks' write buffers), shared by the ops that reorder
their whole input."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchtool.core import budget

RANGE_SHARE = 8
"""One key range is at most --memory / (RANGE_SHARE x tasks): each of the `tasks` sorting at once holds its range
about three times over (the cells read, the sorted copy, the pages of spilled cells it maps), beside the quarter of
--memory the local engine holds (batchtool.exec.held.HELD_SHARE) and the process itself. Measured on the 200 MB
benchmark at the default 1 GB and two threads: shuffle peaked at 0.90-0.93 GB and pack at 0.77-0.78 GB (1.6 GB
each while a range was a quarter of --memory whatever the threads; 1.02 GB for shuffle at a fifth per task)."""

BUFFER_SHARE = 4
"""A map task's write buffers, one per (group, part) cell, take at most --memory / (BUFFER_SHARE x tasks) together."""

_MIN_FLUSH_BYTES, _MAX_FLUSH_BYTES = 16 << 10, 4 << 20


def range_bytes(memory: int, tasks: int) -> int:
    """The most one key range (spill part) may hold under --memory with `tasks` sorting at once (RANGE_SHARE)."""
    return max(1, memory // (RANGE_SHARE * max(1, tasks)))


def flush_bytes(memory: int, cells: int, tasks: int) -> int:
    """The bytes one cell's write buffer collects before it is put (BUFFER_SHARE): more cells, smaller puts."""
    return max(_MIN_FLUSH_BYTES, min(_MAX_FLUSH_BYTES, memory // (BUFFER_SHARE * max(1, tasks) * max(1, cells))))


_SPILL_ROW_BYTES = 12
"""Per spilled row on top of the data: the uint64 example id and the int32 length."""


def spill_row_bytes(sample: pa.RecordBatch | None, columns: Any) -> tuple[float, float]:
    """(bytes per row, bytes per step) of the spilled rows, measured on a sample chunk."""
    per_row, per_step = budget.row_bytes(sample, columns.sequences)
    return per_row + _SPILL_ROW_BYTES, per_step


__all__ = ["BUFFER_SHARE", "RANGE_SHARE", "flush_bytes", "range_bytes", "spill_row_bytes"]
