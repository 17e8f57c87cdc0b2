"""The memory budget of keyed orders through spill files, shared by the ops that reorder their whole input."""

from __future__ import annotations

DEFAULT_MEMORY = 1 << 30
"""--memory's default: the budget of a reorder through spill files."""
PART_SHARE = 4
"""A spill part is at most --memory / PART_SHARE: reading one back holds it about three times over."""


def spill_flush_bytes(memory: int, parts: int) -> int:
    """Spill write buffers together stay under a quarter of the budget, whatever the number of parts."""
    return max(16 << 10, min(4 << 20, memory // (4 * max(1, parts))))


__all__ = ["DEFAULT_MEMORY", "PART_SHARE", "spill_flush_bytes"]
