"""Buckets over two lengths (`bucket --length IN --length OUT`): the exact joint histogram of the first pass, the
grid of cells chosen from it, and the budget a batch of a cell is cut by (its cost counts both padded lengths)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtool.core import budget
from batchtool.core.errors import OptionInputError
from batchtool.ops.boundaries import assign_buckets, choose_boundaries, padded_elements

PAIR_BYTES = 24
"""Memory of the joint histogram per distinct (length, length) pair: the two lengths and the count, int64 each
(a third of it more per key with --balance's class); the limit is counted in pairs seen, not in anything a file
declares."""


# -- the joint histogram ------------------------------------------------------------------------------------------


def pair_counts(first: np.ndarray, second: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """Rows per distinct (first, second) length pair, as an (m, 3) int64 array of (first, second, count) sorted by
    first then second: the exact joint histogram of one chunk (m is at most its rows). With --balance the class
    codes come as a third key: (first, second, class, count)."""
    keys = (first, second, *more)
    if not len(first):
        return np.zeros((0, len(keys) + 1), dtype=np.int64)
    pairs, counts = np.unique(np.stack(keys, axis=1).astype(np.int64), axis=0, return_counts=True)
    return np.column_stack([pairs, counts]).astype(np.int64)


def merge_pairs(a: np.ndarray, b: np.ndarray, memory: int) -> np.ndarray:
    """Two joint histograms (`pair_counts`, with or without classes) summed; an error naming --memory when their
    distinct keys pass its share."""
    both = np.concatenate([a, b])
    if not len(both):
        return both
    pairs, inverse = np.unique(both[:, :-1], axis=0, return_inverse=True)
    what = "(length, length) pairs" if pairs.shape[1] == 2 else "(length, length, class) keys"
    budget.check_fits("memory", f"counting {len(pairs):,} distinct {what}",
                      len(pairs) * both.shape[1] * PAIR_BYTES // 3,
                      memory, "check the length columns, or give a larger {memory}", error=OptionInputError)
    return np.column_stack([pairs, np.bincount(inverse.ravel(), weights=both[:, -1]).astype(np.int64)])


def marginal(pairs: np.ndarray, dim: int) -> np.ndarray:
    """Rows per length of one dimension (a dense histogram up to its longest length)."""
    if not len(pairs):
        return np.zeros(0, dtype=np.int64)
    return np.bincount(pairs[:, dim], weights=pairs[:, 2]).astype(np.int64)


# -- the budget -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridBudget:
    """When a batch of two-length rows is full: `batch_size` rows, or rows x cost(padded in, padded out) at most
    `max_tokens` (and rows at most `max_rows`). The cost of a row is in + out (`linear`), in^2 + out^2
    (`quadratic`) or A*in^2 + B*in*out + C*out (`coefficients`); a zero length counts as one, as in one length."""

    batch_size: int | None = None
    max_tokens: int | None = None
    max_rows: int | None = None
    cost: str = "linear"
    coefficients: tuple[float, float, float] | None = None

    def row_cost(self, first: np.ndarray | int, second: np.ndarray | int) -> np.ndarray:
        """What one row padded to (first, second) steps costs against --max-tokens (vectorised)."""
        x = np.maximum(np.asarray(first, dtype=np.int64), 1)
        y = np.maximum(np.asarray(second, dtype=np.int64), 1)
        if self.coefficients is not None:
            a, b, c = self.coefficients
            return a * x * x + b * x * y + c * y
        return x * x + y * y if self.cost == "quadratic" else x + y

    def batch_cost(self, rows: np.ndarray | int, first: np.ndarray | int, second: np.ndarray | int) -> np.ndarray:
        """rows x a row's cost: what --max-tokens bounds for every batch."""
        return np.asarray(rows) * self.row_cost(first, second)

    def fits_alone(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Per row: does a batch of just this row, padded to these lengths, fit?"""
        if self.batch_size is not None:
            return np.ones(len(first), dtype=bool)
        return self.row_cost(first, second) <= self.max_tokens

    def cut(self, first: np.ndarray, second: np.ndarray, pad_to: tuple[int, int] | None = None) -> np.ndarray:
        """Sizes of the batches for rows of these lengths in this order: greedy, a batch closes when the next row
        would not fit padded to the batch's longest row in each dimension (or to `pad_to`); every row fits alone."""
        if self.batch_size is not None:
            full, rest = divmod(len(first), self.batch_size)
            return np.array([self.batch_size] * full + ([rest] if rest else []), dtype=np.int64)
        assert self.max_tokens is not None
        most = self.max_rows or len(first) or 1
        sizes: list[int] = []
        rows = wide = tall = 0
        for x, y in zip(first.tolist(), second.tolist()):
            w, t = (pad_to if pad_to is not None else (max(wide, x), max(tall, y)))
            if rows and (rows + 1 > most or (rows + 1) * float(self.row_cost(w, t)) > self.max_tokens):
                sizes.append(rows)
                rows, (w, t) = 0, (pad_to if pad_to is not None else (x, y))
            rows, wide, tall = rows + 1, w, t
        if rows:
            sizes.append(rows)
        return np.array(sizes, dtype=np.int64)

    def rows_at(self, first: int, second: int) -> int:
        """--balance: the most rows a batch padded to these lengths may hold, so that no choice of rows a balanced
        batch makes can pass the budget (as BatchBudget.rows_at for one length)."""
        if self.batch_size is not None:
            return self.batch_size
        assert self.max_tokens is not None
        rows = int(self.max_tokens // float(self.row_cost(first, second)))
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def is_partial(self, size: int) -> bool:
        """A cell's last batch is a remainder: by count when short; by tokens always (the cell ran out first)."""
        return self.batch_size is None or size < self.batch_size


# -- the grid -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """Cells of two-length buckets: `first` cuts the first length into buckets as one length's boundaries do
    (TensorFlow's buckets), and `second[i]` cuts the second length of the rows of first-length bucket i the same
    way; cell (i, j) is second-length bucket j of first-length bucket i, numbered in that order."""

    first: tuple[int, ...]
    second: tuple[tuple[int, ...], ...]
    """One boundary list per first-length bucket."""
    pairs: np.ndarray
    """The batchable rows' joint histogram (first, second, count), from the first pass."""
    budget: GridBudget
    """What every cell's batches are cut by."""
    pad_to_boundary: bool = False
    """Batches padded to their cell's longest length in each dimension (else to their own longest rows)."""

    @classmethod
    def choose(cls, pairs: np.ndarray, k: int, budget: GridBudget, pad_to_boundary: bool = False) -> Grid:
        """The grid of at most k cells that pads least (`choose_cells`) over the rows that fit `budget` alone."""
        pairs = batchable(pairs, budget)
        first, second = choose_cells(pairs, k)
        return cls(first, second, pairs, budget, pad_to_boundary)

    def pad_to(self, cell: int) -> tuple[int, int] | None:
        """A cell's fixed padded lengths (--pad-to-boundary), else None (each batch its own longest)."""
        return tuple(int(v) for v in self.cell_longest()[cell]) if self.pad_to_boundary else None  # type: ignore

    def fits_alone(self, cells: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Per row: does it fit the budget alone, padded as its cell pads it (a row the first pass left out of the
        grid, over the budget alone, may be longer than its cell's longest)?"""
        if self.pad_to_boundary:
            longest = self.cell_longest()[cells]
            first, second = np.maximum(longest[:, 0], first), np.maximum(longest[:, 1], second)
        return self.budget.fits_alone(first, second)

    @property
    def shape(self) -> list[int]:
        """Second-length buckets per first-length bucket."""
        return [len(b) + 1 for b in self.second]

    @property
    def cells(self) -> int:
        return sum(self.shape)

    def cell_of(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The cell of each row."""
        return _cells_of(self.first, self.second, first, second)

    def cell_classes(self, labelled: np.ndarray, k: int) -> np.ndarray:
        """--balance: rows per (cell, class), (cells, k), of the batchable rows of a joint histogram with classes
        (first, second, class, count)."""
        labelled = batchable(labelled, self.budget)
        cells = self.cell_of(labelled[:, 0], labelled[:, 1])
        return np.bincount(cells * k + labelled[:, 2], weights=labelled[:, 3],
                           minlength=self.cells * k).astype(np.int64).reshape(self.cells, k)

    def cell_rows(self) -> np.ndarray:
        """Rows per cell (first pass)."""
        return np.bincount(self.cell_of(self.pairs[:, 0], self.pairs[:, 1]), weights=self.pairs[:, 2],
                           minlength=self.cells).astype(np.int64)

    def cell_longest(self) -> np.ndarray:
        """Per cell, its longest length in each dimension, (cells, 2) (0 for an empty cell)."""
        longest = np.zeros((self.cells, 2), dtype=np.int64)
        cells = self.cell_of(self.pairs[:, 0], self.pairs[:, 1])
        for d in (0, 1):
            np.maximum.at(longest[:, d], cells, self.pairs[:, d])
        return longest

    def cell_steps(self, dims: tuple[int, ...] = (0, 1)) -> np.ndarray:
        """Real steps per cell of these dimensions, summed (first pass)."""
        cells = self.cell_of(self.pairs[:, 0], self.pairs[:, 1])
        steps = self.pairs[:, list(dims)].sum(axis=1)
        return np.bincount(cells, weights=steps * self.pairs[:, 2], minlength=self.cells).astype(np.int64)

    def position(self, cell: int) -> tuple[int, int]:
        """(first-length bucket, second-length bucket) of a cell."""
        i = int(np.searchsorted(np.cumsum(self.shape), cell, side="right"))
        return i, cell - sum(self.shape[:i])

    def edges(self, cell: int) -> list[list[int | None]]:
        """The lengths a cell admits in each dimension, [low, high) (None: unbounded)."""
        i, j = self.position(cell)
        return [[(0, *b)[k], (*b, None)[k]] for b, k in ((self.first, i), (self.second[i], j))]

    def bound(self) -> int:
        """What the grid was chosen to minimise (`grid_padding`); the batches written pad at most this."""
        return grid_padding(self.pairs, self.first, self.second)


def _cells_of(first_edges: tuple[int, ...], second_edges: Sequence[tuple[int, ...]], first: np.ndarray,
              second: np.ndarray) -> np.ndarray:
    """The cell of each row: its first-length bucket's offset plus its bucket among that bucket's second lengths."""
    stripes = assign_buckets(first, first_edges)
    offsets = np.cumsum([0, *(len(b) + 1 for b in second_edges)])
    cells = np.zeros(len(first), dtype=np.int64)
    for i, edges in enumerate(second_edges):
        at = stripes == i
        cells[at] = offsets[i] + assign_buckets(second[at], edges)
    return cells


def grid_padding(pairs: np.ndarray, first: tuple[int, ...], second: Sequence[tuple[int, ...]]) -> int:
    """Elements when every row is padded to the longest first length of its first-length bucket and the longest
    second length of its cell: what `choose_cells` minimises."""
    stripes = assign_buckets(pairs[:, 0], first)
    total = padded_elements(marginal(pairs, 0), first)
    for i, edges in enumerate(second):
        total += padded_elements(marginal(pairs[stripes == i], 1), edges)
    return total


def choose_cells(pairs: np.ndarray, k: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """At most k cells: k1 buckets of the first length, each cut into at most floor(k / k1) buckets of its rows'
    second lengths, padding least (`grid_padding`) over the k1 tried.

    For each k1, the first-length boundaries are `choose_boundaries`' optimum for the first length's padding, and
    each bucket's second-length boundaries the optimum for its own rows' second lengths: exact given the first
    buckets. As the second lengths of a first-length bucket may be cut where its rows need it, this never pads
    more than the best product grid (the same second-length boundaries in every first-length bucket) of at most
    k cells. Of the k1 that allow the same k2 = floor(k / k1), only the largest is tried (more first-length
    buckets never pad more); ties go to fewer first-length buckets."""
    if not len(pairs):
        return (), ((),)
    best: tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]] | None = None
    distinct = len(np.unique(pairs[:, 0]))
    for k1 in sorted({min(k // (k // k1), distinct) for k1 in range(1, k + 1)}):
        first = choose_boundaries(marginal(pairs, 0), k1)
        stripes = assign_buckets(pairs[:, 0], first)
        second = tuple(choose_boundaries(marginal(pairs[stripes == i], 1), k // k1) if (stripes == i).any() else ()
                       for i in range(len(first) + 1))
        cost = grid_padding(pairs, first, second)
        if best is None or cost < best[0]:
            best = (cost, first, second)
    assert best is not None
    return best[1], best[2]


def batchable(pairs: np.ndarray, budget: GridBudget) -> np.ndarray:
    """The joint histogram without the pairs over --max-tokens on their own: they can never be batched, so they do
    not shape the grid (with --drop-oversize they are dropped; without it the run stops on them)."""
    if budget.max_tokens is None or not len(pairs):
        return pairs
    return pairs[budget.fits_alone(pairs[:, 0], pairs[:, 1])]
