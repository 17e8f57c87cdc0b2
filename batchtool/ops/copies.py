"""Copies of examples, shared by the ops that resample (stratify with --replacement, resample): how many
of each row, built into output rows in pieces of bounded bytes, and what they count."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.core.budget import row_nbytes
from batchtool.io.dataset import Chunk
from batchtool.ops.base import Expanding
from batchtool.core.tally import Tally

MAX_RATE = float(1 << 32)
"""The largest rate (expected copies of one example): about 4.3 billion copies of a row is surely a mistake,
and Poisson counts stay exact integers far below 2**53."""


PIECE_BYTES = 16 << 20
"""Output Arrow bytes one work item builds: an input chunk whose copies come to more (than this and than the
chunk itself) is written as several row groups of about this size, so a rate never decides memory."""


def copy_runs(copies: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output rows [start, stop) of "row i written copies[i] times, copies consecutive", as runs: the input
    rows, how many of each one's copies fall in the range, and the copy number of each run's first."""
    ends = np.cumsum(copies)
    if stop <= start:
        return (np.zeros(0, dtype=np.int64),) * 3
    rows = np.arange(np.searchsorted(ends, start, side="right"), np.searchsorted(ends, stop - 1, side="right") + 1)
    begins = ends[rows] - copies[rows]
    low = np.maximum(begins, start)
    counts = np.minimum(ends[rows], stop) - low
    keep = counts > 0
    return rows[keep], counts[keep], (low - begins)[keep]


def repeat_rows(chunk: Chunk, copies: np.ndarray, seed: int, stage: str, start: int = 0,
                stop: int | None = None) -> Chunk:
    """Output rows [start, stop) (default: all) of each row copies[i] times, copies consecutive.

    Copy 0 keeps the example id; copy j >= 1 gets a derived id (keyed hash of id and j), so that a
    later reorder (balanced batches, a pipeline's shuffle) keys each copy's draws separately.
    """
    copies = np.asarray(copies, dtype=np.int64)
    stop = int(copies.sum()) if stop is None else stop
    if start == 0 and stop == len(copies) and len(copies) and copies.min() == 1 and copies.max() == 1:
        return chunk
    rows, counts, first = copy_runs(copies, start, stop)
    out = chunk.take(np.repeat(rows, counts))
    copy_no = np.arange(out.num_rows) - np.repeat(np.cumsum(counts) - counts - first, counts)
    extra = copy_no > 0
    if extra.any():
        ids = out.ids.copy()
        ids[extra] = rng.keyed_hash(seed, stage + "/copy", ids[extra], draw=copy_no[extra].astype(np.uint64))
        out = Chunk(out.data, ids)
    return out


def piece_bounds(copies: np.ndarray, row_bytes: np.ndarray, limit: float) -> list[tuple[int, int]]:
    """Cut the output rows (row i written copies[i] times) into consecutive ranges of at most `limit`
    bytes each (at least one row), given each input row's bytes."""
    pieces, start, position, held = [], 0, 0, 0.0
    for n, size in zip(copies.tolist(), np.maximum(row_bytes, 1.0).tolist()):
        while n:
            if held and held + size > limit:
                pieces.append((start, position))
                start, held = position, 0.0
            take = min(n, max(1, int((limit - held) // size)))
            position, held, n = position + take, held + take * size, n - take
    return [*pieces, (start, position)]


@dataclass(frozen=True)
class Copies(Expanding):
    """One input chunk and how many times each of its rows is written, in a keyed order (`seed`, `stage`); cheap
    until its pieces are built."""

    chunk: Chunk
    copies: np.ndarray
    seed: int
    stage: str
    rates: np.ndarray | None = None
    """Per input row, the effective rate written with each of its copies as `rate_column` (--weight), else None."""
    rate_column: str | None = None

    def pieces(self) -> Iterator[CopiesPiece]:
        """The output in pieces of at most PIECE_BYTES (or the input chunk's bytes, if more): one piece
        unless the copies multiply the chunk past that. The last piece carries the chunk's input rows."""
        total = int(self.copies.sum())
        limit = max(PIECE_BYTES, self.chunk.data.nbytes)
        bounds = [(0, total)]
        if total and int(self.copies.max()) * self.chunk.data.nbytes > limit:
            bounds = piece_bounds(self.copies, row_nbytes(self.chunk.data), limit)
        for i, (start, stop) in enumerate(bounds):
            yield CopiesPiece(self, start, stop, self.chunk.num_rows if i == len(bounds) - 1 else 0)

    def rows(self) -> Chunk:
        """Every piece built, as one chunk."""
        return Chunk.concat([piece.build() for piece in self.pieces()], self.chunk.data.schema)


@dataclass(frozen=True)
class CopiesPiece:
    """Output rows [start, stop) of one chunk's copies, and the input rows they complete (for progress)."""

    source: Copies
    start: int
    stop: int
    rows: int

    def build(self) -> Chunk:
        """The piece's rows, with each one's effective rate appended as the copies' `rate_column` if any."""
        src = self.source
        out = repeat_rows(src.chunk, src.copies, src.seed, src.stage, self.start, self.stop)
        if src.rate_column is not None:
            rows, counts, _ = copy_runs(src.copies, self.start, self.stop)
            out = Chunk(out.data.append_column(src.rate_column, pa.array(np.repeat(src.rates[rows], counts),
                                                                         pa.float64())), out.ids)
        return out


def copy_stats(copies: np.ndarray) -> Tally:
    """The counts every resampling command reports: rows in and out, examples dropped and duplicated."""
    tally = Tally()
    tally.add(rows_in=len(copies), rows_out=int(copies.sum()), examples_dropped=int((copies == 0).sum()),
              examples_duplicated=int((copies >= 2).sum()))
    tally.add_values("copies", copies)
    return tally


def copy_summary(tally: Tally) -> dict[str, Any]:
    rows_in = tally.count("rows_in")
    return {"rows_in": rows_in, "examples_dropped": tally.count("examples_dropped"),
            "examples_duplicated": tally.count("examples_duplicated"),
            "copies_per_example": tally.summary("copies", rows_in)}


