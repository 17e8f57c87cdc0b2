"""The steps each packed piece takes in its row and which slot it fills: with --segment-multiple M a piece of s steps
spans ceil(s / M) x M (padded at its end), the plan packs spans, and the pieces of one span share its slots; with
--max-segments K each row's offsets are K + 1 entries, the last one repeated. Pure functions of lengths and the seed.

Which real length fills each slot of a span is fixed by the histogram and the seed alone: the pieces of one span are
ranked shortest length first (the n-th piece of s steps, in input order, takes rank `first[s] + n`) and a keyed
permutation of the ranks gives the slots, so the real steps of any planned row (those --world-size drops, say) follow
from the plan without reading a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.io.padding import list_values, padded_list

SLOT_STAGE = "pack/slot"
"""Keys the permutation of each span's ranks to its slots."""
_BLOCK = 1 << 16
"""Slots inverted at once when reading real lengths back (bounds the index arrays)."""


def spans_of(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Steps each piece takes in its row: its length rounded up to a multiple of `multiple`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return lengths if multiple == 1 else -(-lengths // multiple) * multiple


@dataclass(frozen=True)
class Spans:
    """The histogram pack plans with (pieces per span) and where each real length's pieces rank among its span's."""

    multiple: int
    pieces: np.ndarray
    """pieces[s]: pieces of s real steps (the first pass's histogram)."""
    counts: np.ndarray
    """counts[t]: pieces spanning t steps, what the plan packs."""
    first: np.ndarray
    """first[s]: pieces of the same span as s and fewer real steps, the first rank of s's pieces in their span."""

    @classmethod
    def of(cls, pieces: np.ndarray, multiple: int) -> Spans:
        pieces = np.asarray(pieces, dtype=np.int64)
        span = spans_of(np.arange(len(pieces)), multiple)
        counts = np.bincount(span, pieces, minlength=int(span.max(initial=0)) + 1).astype(np.int64)
        before = np.cumsum(pieces) - pieces  # pieces shorter than s, of every span
        return cls(multiple, pieces, counts, before - (np.cumsum(counts) - counts)[span])

    @property
    def real_steps(self) -> int:
        return int((np.arange(len(self.pieces)) * self.pieces).sum())

    def slots(self, lengths: np.ndarray, ranks: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(span, slot among the span's slots) of pieces of `lengths` real steps, each the ranks[i]-th of its length
        in input order."""
        span = spans_of(lengths, self.multiple)
        slot = rng.index_shuffle(seed, SLOT_STAGE, (self.first[lengths] + ranks).astype(np.uint64), self.counts[span],
                                 tweak=span)
        return span, slot.astype(np.int64)

    def real_steps_in(self, span: int, slots: range, seed: int) -> int:
        """Real steps of the pieces in a range of one span's slots (slots' inverse), a block at a time."""
        if span == 0 or self.multiple == 1:
            return span * len(slots)
        lengths = np.arange(max(0, span - self.multiple + 1), min(span, len(self.pieces) - 1) + 1)
        ends = self.first[lengths] + self.pieces[lengths]
        total = 0
        for start in range(slots.start, slots.stop, _BLOCK):
            block = np.arange(start, min(slots.stop, start + _BLOCK), dtype=np.uint64)
            rank = rng.index_shuffle(seed, SLOT_STAGE, block, int(self.counts[span]), tweak=span, inverse=True)
            total += int(lengths[np.searchsorted(ends, rank.astype(np.int64), side="right")].sum())
        return total


def row_offsets(ends: np.ndarray, row: np.ndarray, within: np.ndarray, rows: int, fixed: int | None) -> pa.ListArray:
    """Per row, 0 then where each of its pieces ends (`ends`, of piece `within` of row `row`; pieces in row order):
    FlashAttention's cu_seqlens for one row. `fixed` K: exactly K + 1 offsets a row, the last one repeated (empty
    segments), so every batch has one shape."""
    if fixed is None:
        n = len(ends)
        out = np.zeros(n + rows, dtype=np.int32)
        out[np.arange(n) + row + 1] = ends
        first = np.flatnonzero(within == 0) + np.arange(rows)
        return pa.ListArray.from_arrays(pa.array(np.concatenate([first, [n + rows]]).astype(np.int32)), pa.array(out))
    table = np.zeros((rows, fixed + 1), dtype=np.int32)
    table[row, within + 1] = ends
    np.maximum.accumulate(table, axis=1, out=table)  # offsets never decrease: the tail repeats the last
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * (fixed + 1)),
                                    pa.array(table.reshape(-1)))


def spread(column: pa.Array, lengths: np.ndarray, multiple: int, pad_value: Any) -> pa.Array:
    """A list column's values with each row's steps followed by `pad_value` up to a multiple of `multiple` steps:
    the pieces as they lie in packed rows. Padded `multiple` steps at a time (padded_list), never a whole row."""
    values, offsets = list_values(column)
    chunks = spans_of(lengths, multiple) // multiple
    piece = np.repeat(np.arange(len(lengths)), chunks)
    k = np.arange(len(piece)) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    starts = offsets[:-1][piece] + k * multiple
    lens = np.clip(lengths[piece] - k * multiple, 0, multiple)
    return padded_list([values], np.zeros(len(piece), dtype=np.int64), starts, lens, multiple, pad_value,
                       column.type.value_field).values


def class_slots(packing: Any, c: int, first: int, stop: int) -> Iterator[tuple[int, range]]:
    """(span, slots among the span's) of rows first .. stop - 1 of class c of a packing (ops.pack.packing.Packing)."""
    for e in np.flatnonzero(packing.entry_class == c).tolist():
        span, q = int(packing.entry_size[e]), int(packing.entry_count[e])
        base = int(packing.entry_start[e] - packing.size_start[np.searchsorted(packing.sizes, span)])
        yield span, range(base + first * q, base + stop * q)


__all__ = ["SLOT_STAGE", "Spans", "class_slots", "row_offsets", "spans_of", "spread"]
