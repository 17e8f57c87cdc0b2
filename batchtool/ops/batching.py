"""When a batch is full: a small object apart from the algorithms that cut batches (bucket, pack)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class BatchBudget:
    """When a batch is full: `batch_size` rows, or a cost of at most `max_tokens` with at most `max_rows`
    rows. The cost is rows x padded length (`linear`, padded elements) or rows x padded length squared
    (`quadratic`, as attention costs); a zero length counts as one. Knows nothing about buckets."""

    batch_size: int | None = None
    max_tokens: int | None = None
    max_rows: int | None = None
    cost: str = "linear"

    def row_cost(self, padded_length: int) -> int:
        """What one row padded to this length costs against --max-tokens."""
        width = max(padded_length, 1)
        return width * width if self.cost == "quadratic" else width

    def fits(self, rows: int, padded_length: int) -> bool:
        if self.batch_size is not None:
            return rows <= self.batch_size
        return (rows * self.row_cost(padded_length) <= self.max_tokens
                and (self.max_rows is None or rows <= self.max_rows))

    def rows_at(self, padded_length: int) -> int:
        """The most rows a batch padded to this length may hold."""
        if self.batch_size is not None:
            return self.batch_size
        rows = self.max_tokens // self.row_cost(padded_length)
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def cut(self, lengths: Iterable[np.ndarray], pad_to: int | None = None) -> np.ndarray:
        """Sizes of the batches, in order, for rows of these lengths arriving in this order.

        Greedy: a batch closes when the next row would not fit (padded to the batch's longest row,
        or to `pad_to`). The last batch holds what is left. Every single row must fit.
        """
        if self.batch_size is not None:
            full, rest = divmod(sum(len(a) for a in lengths), self.batch_size)
            return np.array([self.batch_size] * full + ([rest] if rest else []), dtype=np.int64)
        sizes: list[int] = []
        rows = widest = 0
        for block in lengths:
            for length in block.tolist():
                width = pad_to if pad_to is not None else max(widest, length)
                if rows and not self.fits(rows + 1, width):
                    sizes.append(rows)
                    rows, width = 0, pad_to if pad_to is not None else length
                rows, widest = rows + 1, width
        if rows:
            sizes.append(rows)
        return np.array(sizes, dtype=np.int64)

    def fits_alone(self, padded_lengths: np.ndarray) -> np.ndarray:
        """Per row: does a batch of just this row, padded to this length, fit?"""
        if self.batch_size is not None:
            return np.ones(len(padded_lengths), dtype=bool)
        width = np.maximum(np.asarray(padded_lengths, dtype=np.int64), 1)
        return (width * width if self.cost == "quadratic" else width) <= self.max_tokens

    def is_partial(self, size: int) -> bool:
        """Is a bucket's last batch a remainder? By count: when short; by tokens: always, since the
        bucket ran out before the budget did."""
        return self.batch_size is None or size < self.batch_size


