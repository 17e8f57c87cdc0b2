"""segment's lane planner: which example each of the B lanes plays in which batch, as work items for the workers.

Planning is sequential and cheap (it only looks at segment counts), so it runs in the thread that writes; the
items it makes name their rows, and cutting, padding and encoding them is ops.segment.batches' work.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from batchtool.ops.segment.batches import SegmentItem
from batchtool.ops.segment.chunks import Examples, SegmentPlan, ranges

LANE_WINDOW = 4
"""Examples taken per lane each time a lane runs dry (a fixed window of 4 * B examples)."""
ITEM_SEGMENTS = 2048
"""Segments per work item handed to a worker (rounded to whole batches)..."""
ITEM_BYTES = 16 << 20
"""...and at most this many bytes of padded segments per item (but at least one step: a batch per rank), so a
long --num-unroll or a large --world-size does not multiply what a worker holds."""


@dataclass
class SegmentStats:
    """Counts kept by the planner for the manifest."""

    examples: int = 0
    segments: int = 0
    batches: int = 0
    empty_slots: int = 0
    real_steps: int = 0
    max_sequence_count: int = 0
    empty_batches: int = 0
    """Batches of a rank whose lanes all finished before the other ranks' (written as empty rows)."""

    def as_dict(self, plan: SegmentPlan) -> dict[str, Any]:
        B, U = plan.options.batch_size, plan.options.num_unroll
        slots = self.batches * B
        rows = self.segments + self.empty_batches * B if plan.options.allow_small_batch else slots
        return {"examples": self.examples, "segments": self.segments, "batches": self.batches,
                "lanes": B, "rows_written": rows, "empty_slots": self.empty_slots,
                "empty_slot_fraction": round(self.empty_slots / slots, 6) if slots else 0.0,
                "empty_rows_written": rows - self.segments,
                "real_steps": self.real_steps, "padded_steps": rows * U,
                "padding_efficiency": round(self.real_steps / (rows * U), 6) if rows else 1.0,
                "max_sequence_count": self.max_sequence_count, "world_size": plan.options.world_size,
                "batches_per_rank": self.batches // plan.options.world_size, "empty_batches": self.empty_batches}


class LanePlanner:
    """Assigns examples to lanes and cuts the lanes' segment streams into batches.

    Examples are read in input order in windows of LANE_WINDOW * B; whenever a lane has
    nothing queued, the next window is assigned longest-first (ties: input order) onto the
    lane with the fewest queued segments (ties: lowest lane), i.e. LPT with the queues left
    over as initial loads. Memory holds a window plus what the lanes have queued. With
    world_size N there are N * B lanes: rank r's are lanes r * B .. r * B + B - 1.
    """

    def __init__(self, plan: SegmentPlan, step_bytes: float = 0.0) -> None:
        """`step_bytes`: one step of the plan padded (a batch for each rank: N x B segments)."""
        self.plan = plan
        B = plan.options.batch_size * plan.options.world_size
        self.lanes: list[deque[list]] = [deque() for _ in range(B)]
        self.load = np.zeros(B, dtype=np.int64)
        self.stats = SegmentStats()
        self.window = LANE_WINDOW * B
        self.item_batches = max(1, min(ITEM_SEGMENTS // B, int(ITEM_BYTES // max(step_bytes, 1.0))))

    def items(self, examples: Iterable[Examples]) -> Iterator[SegmentItem]:
        windows = self._windows(examples)
        exhausted = False
        builder = _ItemBuilder(self.item_batches, len(self.lanes), 0)
        while True:
            while not exhausted and not self.load.all():
                window = next(windows, None)
                if window is None:
                    exhausted = True
                else:
                    self._assign(window)
            if not self.load.any():
                break
            k = int(self.load.min()) if not exhausted else int(self.load[self.load > 0].min())
            k = min(k, builder.room)
            self._emit(builder, k)
            if not builder.room:
                yield builder.finish()
                builder = _ItemBuilder(self.item_batches, len(self.lanes), builder.first_batch + builder.filled)
        if builder.filled:
            yield builder.finish()

    def _windows(self, examples: Iterable[Examples]) -> Iterator[list[tuple[Examples, np.ndarray]]]:
        """Windows of `self.window` consecutive examples, as (chunk, rows) pieces."""
        ordinal = 0
        window: list[tuple[Examples, np.ndarray]] = []
        size = 0
        for ex in examples:
            ex = replace(ex, ordinals=ordinal + np.arange(ex.num_rows))
            ordinal += ex.num_rows
            self.stats.examples += ex.num_rows
            self.stats.real_steps += int(ex.total_length.sum())
            start = 0
            while start < ex.num_rows:
                take = min(self.window - size, ex.num_rows - start)
                window.append((ex, np.arange(start, start + take)))
                size += take
                start += take
                if size == self.window:
                    yield window
                    window, size = [], 0
        if window:
            yield window

    def _assign(self, window: list[tuple[Examples, np.ndarray]]) -> None:
        """LPT over the window: its examples (by segment count, longest first) each onto the least loaded lane. The
        heap is sequential; what it reads comes out of NumPy as plain lists, once per window."""
        counts = np.concatenate([ex.count[rows] for ex, rows in window])
        self.stats.max_sequence_count = max(self.stats.max_sequence_count, int(counts.max()))
        order = np.argsort(-counts, kind="stable")
        piece = np.repeat(np.arange(len(window)), [len(rows) for _, rows in window])[order].tolist()
        played = np.concatenate([rows for _, rows in window])[order].tolist()
        heap = [(int(load), lane) for lane, load in enumerate(self.load)]
        heapq.heapify(heap)
        for p, r, c in zip(piece, played, counts[order].tolist()):
            load, lane = heapq.heappop(heap)
            self.lanes[lane].append([window[p][0], r, 0, c])
            heapq.heappush(heap, (load + c, lane))
        for load, lane in heap:
            self.load[lane] = load

    def _emit(self, builder: _ItemBuilder, k: int) -> None:
        """The next k batches: each lane's next k segments (fewer at the very end: empty slots)."""
        filled = np.zeros(len(self.lanes), dtype=np.int64)
        for lane, queue in enumerate(self.lanes):
            t = 0
            while t < k and queue:
                entry = queue[0]
                ex, r, seg, count = entry
                m = min(k - t, count - seg)
                builder.put(t, lane, ex, r, seg, m)
                entry[2] += m
                t += m
                if entry[2] == count:
                    queue.popleft()
                    builder.finished += 1
            self.load[lane] -= t
            self.stats.segments += t
            self.stats.empty_slots += k - t
            filled[lane] = t
        builder.filled += k
        N = self.plan.options.world_size
        self.stats.batches += k * N
        self.stats.empty_batches += int((k - filled.reshape(N, -1).max(axis=1)).sum())


class _ItemBuilder:
    """Slot arrays of one SegmentItem being filled by the planner: it records runs (a lane's m consecutive
    slots playing consecutive segments of one example), expanded into the arrays at once by finish()."""

    def __init__(self, batches: int, lanes: int, first_batch: int) -> None:
        self.first_batch = first_batch
        self.batches = batches
        self.lanes = lanes
        self.filled = 0
        self.finished = 0
        self.runs: list[tuple[int, int, int, int, int, int]] = []
        """(first slot's batch, lane, source, row, first segment, m) per run."""
        self.sources: dict[int, int] = {}
        self.source_list: list[Examples] = []

    @property
    def room(self) -> int:
        return self.batches - self.filled

    def put(self, t: int, lane: int, ex: Examples, row: int, seg: int, m: int) -> None:
        index = self.sources.get(id(ex))
        if index is None:
            index = self.sources[id(ex)] = len(self.source_list)
            self.source_list.append(ex)
        self.runs.append((self.filled + t, lane, index, row, seg, m))

    def finish(self) -> SegmentItem:
        n = self.filled
        src = np.full((n, self.lanes), -1, dtype=np.int32)
        row = np.zeros((n, self.lanes), dtype=np.int64)
        seg = np.zeros((n, self.lanes), dtype=np.int32)
        sources = tuple(self.source_list)
        if self.runs:
            first, lane, source, rows, segs, m = np.array(self.runs, dtype=np.int64).T
            sources, rows = self._compacted(source, rows)
            slots = (ranges(first, m), np.repeat(lane, m))
            src[slots] = np.repeat(source, m)
            row[slots] = np.repeat(rows, m)
            seg[slots] = ranges(segs, m)
        return SegmentItem(self.first_batch, sources, src, row, seg, self.finished)

    def _compacted(self, source: np.ndarray, rows: np.ndarray) -> tuple[tuple[Examples, ...], np.ndarray]:
        """Each stored source cut to the rows the runs play (an item bound for another process carries those only:
        their numbers, and where the rows are), and the runs' rows renumbered in it; a source whose rows are in
        memory goes whole, as a reference (cutting it would copy the rows the item plays once more)."""
        renumbered = rows.copy()
        sources = []
        for i, examples in enumerate(self.source_list):
            if examples.stored is None:
                sources.append(examples)
                continue
            mine = source == i
            used, renumbered[mine] = np.unique(rows[mine], return_inverse=True)
            sources.append(examples.take(used))
        return tuple(sources), renumbered

__all__ = ["ITEM_BYTES", "ITEM_SEGMENTS", "LANE_WINDOW", "LanePlanner", "SegmentStats"]
