"""pack --world-size: the planned rows assigned to (step, rank) so that at every step each rank's cost (a x L^2 + b x L
summed over the document pieces of its rows) is close to the step's mean; from the plan's row classes and the seed
alone, never rows.

The rows are sorted by cost (heaviest first) and cut into tuples of N consecutive rows (N = --world-size); a tuple's
rows go to the N ranks of one step, one each, so a rank gets one row of each of its step's B tuples (B =
--batch-size). Tuples whose rows cost alike fill steps in keyed order; the others, in cost order, are put
together B to a step, where they can offset each other; the steps then go in keyed order. Within a step its tuples
are dealt heaviest first, each tuple's heaviest row to the rank carrying the least so far. That keeps the spread of
the step's rank costs (max - min) within the largest spread of one of its tuples: by induction, after a tuple dealt
that way the spread is at most the larger of the spread before and the tuple's own. Rows of one class cost the
same, so a tuple inside one class has no spread, and only steps holding a tuple that straddles classes can be
unbalanced at all; those are then improved by swaps between their heaviest rank and the others (swaps never raise
the maximum nor lower the minimum, so the bound holds after them). The manifest records the max/mean rank cost
reached per step (worst and mean).

Every step is full on every rank: the rows beyond the last multiple of N x B (fewer than N x B) are the ones with
the fewest real steps; their examples are dropped and counted (`examples_dropped.remainder`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from batchtool.core import rng
from batchtool.ops.pack.packing import Packing

RANK_STAGE, STEP_STAGE = "pack/ranks", "pack/steps"
"""Key the order of the tuples of rows whose costs are alike, and the order of the steps."""
SWAPS = 64
"""Swaps tried per unbalanced step (each moving cost off its heaviest rank, the best pair first)."""
TOLERANCE = 0.02
"""The max/mean rank cost per step aimed at (the swaps stop below it); the manifest counts the steps above."""
LAYOUT = "steps"
"""The manifest's rank layout: output batch k is rank k % world_size's batch at step k // world_size."""


@dataclass(frozen=True)
class RankPlan:
    """Where each planned row goes: its output position (step x N + rank) x B + its place in the batch, or -1 for a
    row of the remainder."""

    world_size: int
    batch_size: int
    position: np.ndarray
    """Output position of each row id (-1: dropped, the remainder)."""
    row_at: np.ndarray
    """Row id at each output position."""
    dropped_rows: int
    dropped_examples: int
    dropped_steps: int
    ratios: np.ndarray
    """max / mean rank cost of each step."""
    class_dropped: np.ndarray
    """Rows of each class of the packing dropped: its last ones (its first rows are the ones placed)."""

    @property
    def steps(self) -> int:
        return len(self.ratios)

    def report(self, balance: str, coefficients: tuple[float, float]) -> dict[str, Any]:
        """The manifest's account of the assignment: layout, cost model, balance reached, the remainder dropped."""
        ratios = self.ratios
        return {
            "rank_layout": {"world_size": self.world_size, "layout": LAYOUT, "steps": self.steps},
            "rank_balance": {"balance": balance, "cost_coefficients": list(coefficients),
                             "steps_above_tolerance": int((ratios > 1 + TOLERANCE).sum()),
                             "tolerance": TOLERANCE},
            "rank_cost_max_over_mean": {"worst": round(float(ratios.max()), 6) if len(ratios) else 1.0,
                                        "mean": round(float(ratios.mean()), 6) if len(ratios) else 1.0},
            "rows_dropped_remainder": self.dropped_rows,
        }


def class_costs(packing: Packing, coefficients: tuple[float, float]) -> np.ndarray:
    """Cost of one row of each class: sum over its pieces of a x L^2 + b x L."""
    a, b = coefficients
    s = packing.entry_size.astype(np.float64)
    piece = packing.entry_count * (a * s * s + b * s)
    return np.bincount(packing.entry_class, piece, minlength=len(packing.rows))


def kept_rows(packing: Packing, unit: int) -> np.ndarray:
    """Rows of each class written: all but the remainder (total rows mod `unit`), taken from the rows with the fewest
    real steps (ties: the later class), so that what is dropped is as little data as the remainder allows."""
    kept = packing.rows.astype(np.int64).copy()
    extra = int(kept.sum()) % unit
    for c in np.lexsort((-np.arange(len(kept)), packing.class_length)):
        if not extra:
            break
        take = min(extra, int(kept[c]))
        kept[c] -= take
        extra -= take
    return kept


def assign_ranks(packing: Packing, coefficients: tuple[float, float], world_size: int, batch_size: int,
                 seed: int) -> RankPlan:
    """The (step, rank) of every planned row (module docstring): O(rows x log N) time, 16 bytes per row."""
    N, B = world_size, batch_size
    rows = packing.rows.astype(np.int64)
    kept = kept_rows(packing, N * B)
    cost = class_costs(packing, coefficients)
    order = np.lexsort((np.arange(len(rows)), -cost))  # heaviest class first, ties by class
    counts = kept[order]
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    within = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    sorted_rows = np.repeat(packing.row_base[order], counts) + within
    sorted_cost = np.repeat(cost[order], counts)
    tuples = total // N
    steps = tuples // B
    tuple_cost = sorted_cost.reshape(tuples, N)
    by_step = _steps(tuple_cost, B, seed)
    member_rank = np.empty((tuples, N), dtype=np.int64)
    loads = np.zeros((steps, N))
    step_index = np.arange(steps)[:, None]
    for j in range(B):
        t = by_step[:, j]
        lightest = np.argsort(loads, axis=1, kind="stable")
        member_rank[t] = lightest
        loads[step_index, lightest] += tuple_cost[t]
    place = np.empty((tuples, N), dtype=np.int64)
    place[by_step.reshape(-1)] = np.tile(np.arange(B), steps)[:, None]
    step_of = np.empty(tuples, dtype=np.int64)
    step_of[by_step.reshape(-1)] = np.repeat(np.arange(steps), B)
    _improve(loads, member_rank, place, by_step, tuple_cost)
    positions = ((step_of[:, None] * N + member_rank) * B + place).reshape(-1)
    position = np.full(packing.total_rows, -1, dtype=np.int64)
    position[sorted_rows] = positions
    row_at = np.empty(total, dtype=np.int64)
    row_at[positions] = sorted_rows
    dropped = rows - kept
    mean = loads.mean(axis=1) if steps else np.zeros(0)
    ratios = np.where(mean > 0, loads.max(axis=1, initial=0) / np.where(mean > 0, mean, 1), 1.0)
    return RankPlan(N, B, position, row_at, int(dropped.sum()), int((dropped * packing.class_examples).sum()),
                    int((dropped * packing.class_length).sum()), ratios, dropped)


def _steps(tuple_cost: np.ndarray, batch_size: int, seed: int) -> np.ndarray:
    """[steps, B] tuples of each step, heaviest first. Tuples whose rows cost alike ("flat") cannot unbalance a step;
    the others ("mixed", in cost order) are put together, B to a step, so that their spreads can offset each other
    when dealt; the flat tuples fill the other steps in keyed order, and the steps are then put in keyed order."""
    tuples = len(tuple_cost)
    mixed = tuple_cost[:, 0] > tuple_cost[:, -1] if tuples else np.zeros(0, bool)
    flat = np.flatnonzero(~mixed)
    keys = rng.index_shuffle(seed, RANK_STAGE, np.arange(len(flat), dtype=np.uint64), max(len(flat), 1))
    groups = np.concatenate([np.flatnonzero(mixed), flat[np.argsort(keys, kind="stable")]]).reshape(-1, batch_size)
    step_of = rng.index_shuffle(seed, STEP_STAGE, np.arange(len(groups), dtype=np.uint64), max(len(groups), 1))
    by_step = np.empty_like(groups)
    by_step[step_of.astype(np.int64)] = groups
    return np.sort(by_step, axis=1)


def _improve(loads: np.ndarray, member_rank: np.ndarray, place: np.ndarray, by_step: np.ndarray,
             tuple_cost: np.ndarray) -> None:
    """Steps above TOLERANCE: up to SWAPS times, swap a row of the heaviest rank with a lighter one of another rank,
    the pair that lowers the heaviest rank most without making the other the heaviest; in place. Swapped rows
    trade places in their batches too, so each rank still holds one row per place."""
    mean = loads.mean(axis=1)
    for s in np.flatnonzero(loads.max(axis=1, initial=0) > (1 + TOLERANCE) * mean):
        t = by_step[s]
        ranks, cost = member_rank[t].reshape(-1), tuple_cost[t].reshape(-1)  # every row of the step
        places = place[t].reshape(-1)
        for _ in range(SWAPS):
            high = int(np.argmax(loads[s]))
            if loads[s, high] <= (1 + TOLERANCE) * mean[s]:
                break
            heavy, other = np.flatnonzero(ranks == high), np.flatnonzero(ranks != high)
            diff = cost[heavy][:, None] - cost[other][None, :]
            gap = loads[s, high] - loads[s, ranks[other]]
            gain = np.where((diff > 0) & (diff < gap), np.minimum(diff, gap - diff), 0)
            if not gain.max(initial=0) > 0:
                break
            i, k = np.unravel_index(int(np.argmax(gain)), gain.shape)
            a, b = heavy[i], other[k]
            low, d = int(ranks[b]), diff[i, k]
            ranks[a], ranks[b] = low, high
            places[a], places[b] = places[b], places[a]
            loads[s, high] -= d
            loads[s, low] += d
        member_rank[t] = ranks.reshape(len(t), -1)
        place[t] = places.reshape(len(t), -1)


__all__ = ["LAYOUT", "RANK_STAGE", "STEP_STAGE", "RankPlan", "TOLERANCE", "assign_ranks", "class_costs", "kept_rows"]
