"""Exact mode's thresholds: the k-th smallest keyed hash of each class, found in passes over the label column only."""

from __future__ import annotations

import functools

import numpy as np

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.ops.base import Scan
from batchtool.ops.labels import Locate, label_codes
from batchtool.ops.stratify.plans import STAGE

SELECT_BUDGET = 1 << 22
"""Keyed hashes held at once while finding the exact per-class thresholds (32 MiB)."""
HIST_BITS = 16


def window_chunk(chunk: Chunk, column: str, num_classes: int, windows: dict[int, tuple[int, int, bool]],
                 seed: int, locate: Locate) -> dict[int, np.ndarray]:
    """One chunk's part of a threshold pass: for each class, the keyed hashes whose top `bits` bits equal
    `prefix`, either collected or counted in a histogram of their next HIST_BITS bits."""
    labels = label_codes(chunk, column, num_classes, locate)
    hashes = rng.keyed_hash(seed, STAGE, chunk.ids)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    result = {}
    for cls, (prefix, bits, collect) in windows.items():
        h = hashes[order[bounds[cls]:bounds[cls + 1]]]
        if bits:
            h = h[(h >> np.uint64(64 - bits)) == np.uint64(prefix)]
        if collect:
            result[cls] = h
        else:
            low = (h >> np.uint64(64 - bits - HIST_BITS)) & np.uint64((1 << HIST_BITS) - 1)
            result[cls] = np.bincount(low.astype(np.int64), minlength=1 << HIST_BITS)
    return result


def _window(chunk: Chunk, *, column: str, num_classes: int, windows: dict[int, tuple[int, int, bool]], seed: int,
            locate: Locate) -> dict[int, np.ndarray]:
    return window_chunk(chunk, column, num_classes, windows, seed, locate)


def find_thresholds(scan: Scan, column: str, num_classes: int, ranks: dict[int, int], counts: np.ndarray,
                    seed: int, locate: Locate, budget: int = SELECT_BUDGET) -> dict[int, int]:
    """The ranks[c]-th smallest keyed hash of each class c, exactly, reading only the label column.

    Each pass either collects a class's hashes (when its window holds at most `budget` of them) and
    selects the rank, or histograms the window by the next 16 bits and narrows it to the bin holding
    the rank. Small classes finish in one pass; a class of n examples needs about
    1 + log_65536(n / budget) passes. Keyed hashes never tie, so the threshold keeps exactly that many.
    """
    state = {cls: (rank, 0, 0, int(counts[cls])) for cls, rank in ranks.items()}
    found: dict[int, int] = {}
    while state:
        collect, used = set(), 0
        for cls, (_, _, bits, size) in sorted(state.items(), key=lambda kv: kv[1][3]):
            if used + size <= budget or bits + HIST_BITS >= 64:
                collect.add(cls)
                used += size
        windows = {cls: (prefix, bits, cls in collect) for cls, (_, prefix, bits, _) in state.items()}
        parts: dict[int, list[np.ndarray]] = {cls: [] for cls in state}
        window = functools.partial(_window, column=column, num_classes=num_classes, windows=windows, seed=seed,
                                   locate=locate)
        for result in scan([column], window):
            for cls, values in result.items():
                parts[cls].append(values)
        for cls, (rank, prefix, bits, _) in list(state.items()):
            if cls in collect:
                values = np.concatenate(parts[cls])
                found[cls] = int(np.partition(values, rank - 1)[rank - 1])
                del state[cls]
            else:
                cumulative = np.cumsum(np.sum(parts[cls], axis=0))
                b = int(np.searchsorted(cumulative, rank))
                below = int(cumulative[b - 1]) if b else 0
                size = int(cumulative[b]) - below
                state[cls] = (rank - below, (prefix << HIST_BITS) | b, bits + HIST_BITS, size)
    return found


__all__ = ["HIST_BITS", "SELECT_BUDGET", "find_thresholds", "window_chunk"]
