"""The order `batchtool.load` reads batches in: pure functions of (seed, epoch, the output's layout, the ranks), and
the state that resumes it, also on another number of ranks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchtool.core import rng
from batchtool.core.errors import UsageError

SHUFFLE_BLOCK_BATCHES = 8192
"""A shuffled epoch permutes the files, then the batches within blocks of consecutive files (those starting
in each stretch of this many batches), so a reader holds the footers of one block, never the whole output's."""
FIXED_KEYS = ("seed", "shuffle", "drop_uneven", "batches")
"""What a state must share with the loader it resumes: they fix the epoch's order."""


def epoch_order(file_batches: Sequence[int], seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(batch numbers in the order epoch `epoch` visits them, the block of each), where batches are numbered
    in file order. Shuffled: a keyed permutation of the files, cut into blocks of about
    SHUFFLE_BLOCK_BATCHES batches, each block's batches permuted. No process state is involved, so the
    order is the same on any machine, for any rank, worker or thread count."""
    counts = np.asarray(file_batches, dtype=np.int64)
    file_of = np.repeat(np.arange(len(counts)), counts)
    if not shuffle:
        return np.arange(len(file_of), dtype=np.int64), file_of
    files = np.argsort(rng.permutation_keys(seed, f"load/files/{epoch}", np.arange(len(counts), dtype=np.uint64)))
    before = np.cumsum(counts[files]) - counts[files]
    block = np.empty(len(counts), dtype=np.int64)
    block[files] = before // SHUFFLE_BLOCK_BATCHES
    keys = rng.permutation_keys(seed, f"load/epoch/{epoch}", np.arange(len(file_of), dtype=np.uint64))
    order = np.lexsort((keys, block[file_of]))
    return order.astype(np.int64), block[file_of][order]


def rank_positions(batches: int, rank: int, world_size: int, drop_uneven: bool, start: int = 0) -> np.ndarray:
    """Positions in the epoch order that rank `rank` reads: from `start` (what earlier ranks consumed), every
    world_size-th, so that whatever all ranks have read at any step is a prefix of the epoch's order, the one
    thing that lets another number of ranks continue it. drop_uneven drops the last
    `(batches - start) % world_size` positions; otherwise the order is extended cyclically from its start, so
    some batches are read twice (by different ranks)."""
    per = rank_count(batches, world_size, drop_uneven, start)
    return (start + rank + world_size * np.arange(per, dtype=np.int64)) % max(batches, 1)


def rank_count(batches: int, world_size: int, drop_uneven: bool, start: int = 0) -> int:
    """How many positions each rank reads (rank_positions' length, in O(1))."""
    remaining = max(batches - start, 0)
    return remaining // world_size if drop_uneven else -(-remaining // world_size)


@dataclass(frozen=True)
class Resume:
    """Where a loaded state puts this loader in its epoch: rank positions from `start`, the next at `position`;
    `worker` is (id, workers) when the state is a DataLoader worker's own (its position is then its next)."""

    epoch: int
    start: int
    position: int
    worker: tuple[int, int] | None


def resume(state: dict[str, Any], mine: dict[str, Any], fixed: Callable[[int, int], str] | None) -> Resume:
    """The Resume of `state` (what Loader.state_dict returned) for a loader whose own state is `mine`: a UsageError
    when it comes from a loader of another order, or another number of ranks where the output fixes each rank's
    stream when it is written (`fixed`: why, and what to do, for the saved and this loader's world sizes). With
    another world size, the ranks of the state together consumed the first `start + position * world_size` batches
    of the epoch's order; this loader's ranks continue from there."""
    missing = [k for k in ("epoch", "position", "world_size", *FIXED_KEYS) if k not in state]
    if missing:
        raise UsageError(f"load_state_dict: the state has no {', '.join(missing)}; pass what state_dict() returned")
    for key in FIXED_KEYS:
        if state[key] != mine[key]:
            raise UsageError(f"load_state_dict: the state was saved with {key}={state[key]!r}, this loader has "
                             f"{key}={mine[key]!r}; resuming would not continue the same order")
    start, position, saved = int(state.get("start", 0)), int(state["position"]), int(state["world_size"])
    worker = (int(state["worker"]), int(state["workers"])) if "worker" in state else None
    if saved == mine["world_size"]:
        return Resume(int(state["epoch"]), start, position, worker)
    if fixed is not None:
        raise UsageError(f"load_state_dict: the state was saved on {saved} ranks, this loader has world_size="
                         f"{mine['world_size']}: {fixed(saved, mine['world_size'])}")
    if worker is not None:
        raise UsageError("load_state_dict: a DataLoader worker's state resumes that worker only, on as many ranks; "
                         "take the state from the StatefulDataLoader (or pass position=) to change the world size")
    consumed = min(start + position * saved, int(mine["batches"]))
    return Resume(int(state["epoch"]), consumed, 0, None)
