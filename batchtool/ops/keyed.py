"""The memory budget of keyed orders through spill files, shared by the ops that reorder their whole input."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchtool import budget

PART_SHARE = 4
"""A spill part is at most --memory / PART_SHARE: reading one back holds it about three times over."""


def spill_flush_bytes(memory: int, parts: int) -> int:
    """Spill write buffers together stay under a quarter of the budget, whatever the number of parts."""
    return max(16 << 10, min(4 << 20, memory // (4 * max(1, parts))))


_MIN_FLUSH_BYTES, _MAX_FLUSH_BYTES = 64 << 10, 4 << 20


_SPILL_ROW_BYTES = 12
"""Per spilled row on top of the data: the uint64 example id and the int32 length."""


def row_bytes(sample: pa.RecordBatch | None, columns: Any) -> tuple[float, float]:
    """(bytes per row, bytes per step) of the spilled rows, measured on a sample chunk."""
    per_row, per_step = budget.row_bytes(sample, columns.sequences)
    return per_row + _SPILL_ROW_BYTES, per_step


def flush_bytes(plan: Any, memory: int) -> int:
    """Spill write buffers (one per group and part of `plan.parts`) take at most a quarter of --memory together."""
    return max(_MIN_FLUSH_BYTES, min(_MAX_FLUSH_BYTES, memory // (4 * sum(plan.parts))))


__all__ = ["PART_SHARE", "spill_flush_bytes"]
