"""Keyed orders through spill files, shared by the ops that reorder their whole input: a spill whose streams
are read back sorted by each row's keyed order, sized from the memory budget."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from batchtool.dataset import Chunk
from batchtool.ops.base import Bar
from batchtool.spill import Spill

DEFAULT_MEMORY = 1 << 30
"""--memory's default: the budget of a reorder through spill files."""
PART_SHARE = 4
"""A spill part is at most --memory / PART_SHARE: reading one back holds it about three times over."""


def spill_flush_bytes(memory: int, parts: int) -> int:
    """Spill write buffers together stay under a quarter of the budget, whatever the number of parts."""
    return max(16 << 10, min(4 << 20, memory // (4 * max(1, parts))))


def keyed_spill(schema: pa.Schema, parts: Sequence[int], seed: int, stage: str, memory: int,
                tmp_dir: str | None) -> Spill:
    """A spill of several streams (the classes of balanced batches, or the one stream of a global shuffle),
    each read back sorted by its rows' keyed order: stream s is split into parts[s] ranges of that key,
    which changes how many files hold it, never its order (see batchtool.spill)."""
    return Spill(schema, parts, seed, stage, tmp_dir, flush_bytes=spill_flush_bytes(memory, sum(parts)))


def spill_streams(chunks: Iterable[Chunk], spill: Spill, streams_of: Callable[[Chunk], np.ndarray], bar: Bar) -> None:
    """Scatter every row of the chunks to its stream (counting them on the caller's progress bar), then close
    the spill for reading."""
    for chunk in chunks:
        spill.add(chunk, streams_of(chunk))
        bar.update(chunk.num_rows)
    spill.finish()


__all__ = ["DEFAULT_MEMORY", "PART_SHARE", "keyed_spill", "spill_flush_bytes", "spill_streams"]
