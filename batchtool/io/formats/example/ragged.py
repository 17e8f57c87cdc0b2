"""NumPy helpers over ragged runs (many variable-length items in one flat array), for the decoder, the scan and
the encoder, which handle every Feature of a column at once."""

from __future__ import annotations

import numpy as np

SLICE = 1 << 18
"""Features walked or decoded at a time: bounds the temporaries of one column of one chunk."""


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """Start offset of each segment given segment lengths (int64, length n+1)."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def segment_sums(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sum of values over consecutive segments of the given lengths."""
    total = exclusive_cumsum(values)
    bounds = exclusive_cumsum(counts)
    return total[bounds[1:]] - total[bounds[:-1]]


def ragged_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every position in the ranges [start, start + length), in order."""
    firsts = exclusive_cumsum(lengths)
    return np.repeat(starts - firsts[:-1], lengths) + np.arange(firsts[-1])
