"""Synthetic sequence corpora, seeded: the sample data, the benchmarks and the tests all draw from here."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

CLASS_PROBS = (0.90, 0.07, 0.02, 0.01)


def lognormal_lengths(rng: np.random.Generator, rows: int, median_length: float, max_length: int) -> np.ndarray:
    """Long-tailed example lengths: lognormal around the median (sigma 0.8), rounded, clipped to [1, max]."""
    return np.clip(np.round(rng.lognormal(np.log(median_length), 0.8, rows)), 1, max_length).astype(np.int64)


def make_table(rows: int, seed: int, first: int = 0, median_length: float = 30.0, max_length: int = 400,
               frame_dim: int = 3, vocab: int = 1000) -> pa.Table:
    """`rows` examples numbered from `first`; a pure function of its arguments."""
    rng = np.random.default_rng([seed, first])
    lengths = lognormal_lengths(rng, rows, median_length, max_length)
    labels = rng.choice(len(CLASS_PROBS), size=rows, p=CLASS_PROBS).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    steps = int(offsets[-1])
    tokens = rng.integers(1, vocab, size=steps, dtype=np.int64)
    frames = rng.standard_normal(steps * frame_dim, dtype=np.float32).round(2)
    return pa.table({
        "key": pa.array([f"ex-{i:08d}" for i in range(first, first + rows)], pa.string()),
        "label": pa.array(labels),
        "weight": pa.array(rng.gamma(2.0, 0.5, rows).astype(np.float32)),
        "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
        "frames": pa.ListArray.from_arrays(
            pa.array(offsets), pa.FixedSizeListArray.from_arrays(pa.array(frames), frame_dim)),
    })
