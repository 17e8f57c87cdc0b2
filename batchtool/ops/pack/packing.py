"""Packing plans: which lengths share a row, chosen globally from a length histogram (no rows, no I/O).

A plan is a short list of row classes: `m` identical rows, each holding `q` examples of length `s`
for a few lengths `s`. Planning reads only the counts of each length, so it costs memory and time in
the number of distinct lengths (milliseconds for millions of examples), never in the number of
examples; which example fills which slot of which row is decided afterwards by keyed randomness
(`Packing.rows_of`).

Several heuristics run over the histogram and the plan with the fewest rows wins (ties: the first):
best-fit decreasing, and hybrids that first deal the long examples worst-fit over a preset number of
rows (the lower bound, then the fewest that hold everything), then best-fit the rest; these keep short
examples for the gaps, which matters under --max-examples-per-row. Small instances are also searched
exactly. docs/benchmarks.md (pack) has the measured efficiency of each.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_NONE = 1 << 62
"""'No limit' for counts of examples (a row, or a bin with no --max-examples-per-row)."""
HYBRID_QUANTILES = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
"""Length quantiles tried as the worst-fit/best-fit threshold of the hybrid candidates."""
SEARCHED = 2
"""Hybrid thresholds (the best ones at `bound` preset rows) whose preset rows are then bisected."""
EXACT_MAX_EXAMPLES = 64
"""Instances with at most this many examples are also searched exactly (branch and bound)."""
EXACT_NODES = 20_000
"""Node budget of the exact search: beyond it, the best packing found so far stands."""


@dataclass(frozen=True)
class Packing:
    """Row classes: `rows[c]` identical rows holding `entry_count[e]` examples of length `entry_size[e]`
    for every entry e with `entry_class[e] == c`. Entries are sorted by (size, class)."""

    max_length: int
    rows: np.ndarray
    entry_class: np.ndarray
    entry_size: np.ndarray
    entry_count: np.ndarray
    method: str
    row_base: np.ndarray = field(init=False, repr=False)
    """First row id of each class (rows of class c are row_base[c] .. row_base[c] + rows[c] - 1)."""
    class_length: np.ndarray = field(init=False, repr=False)
    class_examples: np.ndarray = field(init=False, repr=False)
    sizes: np.ndarray = field(init=False, repr=False)
    """Distinct example lengths, ascending."""
    size_start: np.ndarray = field(init=False, repr=False)
    """Global slot number of the first slot of each distinct length (slots are numbered length by length)."""
    entry_start: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rows = self.rows.astype(np.int64)
        classes = len(rows)
        slots = rows[self.entry_class] * self.entry_count
        derived = {
            "row_base": np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64) if classes
            else np.zeros(0, np.int64),
            "class_length": np.bincount(self.entry_class, self.entry_size * self.entry_count,
                                        minlength=classes).astype(np.int64),
            "class_examples": np.bincount(self.entry_class, self.entry_count, minlength=classes).astype(np.int64),
            "entry_start": np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64) if len(slots)
            else np.zeros(0, np.int64),
        }
        sizes, first = np.unique(self.entry_size, return_index=True)
        derived["sizes"] = sizes.astype(np.int64)
        derived["size_start"] = derived["entry_start"][first]
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def total_rows(self) -> int:
        return int(self.rows.sum())

    @property
    def real_steps(self) -> int:
        return int((self.rows * self.class_length).sum())

    @property
    def examples(self) -> int:
        return int((self.rows * self.class_examples).sum())

    def efficiency(self) -> float | None:
        """Real steps / (rows x max_length): the share of a full-length row layout that is data."""
        rows = self.total_rows
        return round(self.real_steps / (rows * self.max_length), 6) if rows and self.max_length else None

    def rows_of(self, sizes: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Row id of slot `slots[i]` (0 .. count of that length - 1) among the slots of length `sizes[i]`."""
        sizes = np.asarray(sizes, dtype=np.int64)
        g = self.size_start[np.searchsorted(self.sizes, sizes)] + np.asarray(slots, dtype=np.int64)
        e = np.searchsorted(self.entry_start, g, side="right") - 1
        within = g - self.entry_start[e]
        return self.row_base[self.entry_class[e]] + within // self.entry_count[e]

    def row_shape(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(real steps, examples) of each row id."""
        c = np.searchsorted(self.row_base, np.asarray(rows, dtype=np.int64), side="right") - 1
        return self.class_length[c], self.class_examples[c]

    def examples_per_row(self) -> dict[int, int]:
        """{examples in a row: rows}."""
        counts = np.bincount(self.class_examples, weights=self.rows).astype(np.int64)
        return {int(k): int(v) for k, v in enumerate(counts) if v}


def lower_bound(counts: np.ndarray, max_length: int, max_examples: int | None = None) -> int:
    """Rows no packing can beat: the Martello-Toth bound L2 (which is at least ceil(steps / L)), and
    ceil(examples / K) under --max-examples-per-row K."""
    counts = np.asarray(counts, dtype=np.int64)
    sizes = np.flatnonzero(counts)
    if not len(sizes):
        return 0
    c = counts[sizes]
    L = max_length
    cum_n = np.concatenate([[0], np.cumsum(c)])
    cum_s = np.concatenate([[0], np.cumsum(c * sizes)])

    def between(lo: np.ndarray, hi: np.ndarray, cum: np.ndarray) -> np.ndarray:
        """Sum over sizes in [lo, hi]."""
        return cum[np.searchsorted(sizes, hi, side="right")] - cum[np.searchsorted(sizes, lo, side="left")]

    half = L // 2
    alpha = np.concatenate([[0], sizes[sizes <= half]])
    j1 = between(L - alpha + 1, np.full_like(alpha, L), cum_n)
    j2 = between(np.full_like(alpha, half + 1), L - alpha, cum_n)
    free2 = j2 * L - between(np.full_like(alpha, half + 1), L - alpha, cum_s)
    s3 = between(alpha, np.full_like(alpha, half), cum_s)
    l2 = j1 + j2 + np.maximum(0, -(-(s3 - free2) // L))
    bound = max(int(l2.max()), -(-int(cum_s[-1]) // L))
    if max_examples is not None:
        bound = max(bound, -(-int(cum_n[-1]) // max_examples))
    return bound


def plan_packing(counts: np.ndarray, max_length: int, max_examples: int | None = None
                 ) -> tuple[Packing, dict[str, Any]]:
    """The plan with the fewest rows among the candidates, and a report (rows of every candidate, the
    lower bound, whether the plan is proven optimal). `counts[s]` = examples of length s (s <= L).

    Candidates: best-fit decreasing; for each threshold of HYBRID_QUANTILES, lengths above it dealt
    worst-fit over `bound` rows, then best-fit; for the SEARCHED best thresholds, the fewest preset rows
    that leave nothing over (bisection, as iterated worst-fit decreasing does); and for small instances
    an exact search."""
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) > max_length + 1 and counts[max_length + 1:].any():
        raise ValueError(f"lengths over max_length {max_length} cannot be packed")
    bound = lower_bound(counts, max_length, max_examples)
    best = _pack(counts, max_length, max_examples)
    candidates = {best.name: best.total_rows}
    sizes = np.flatnonzero(counts)
    if len(sizes) and bound:
        cum = np.cumsum(counts[sizes])
        thetas = sorted({int(sizes[min(len(sizes) - 1, int(np.searchsorted(cum, q * cum[-1], side="right")))])
                         if q else 0 for q in HYBRID_QUANTILES})
        hybrids = [_pack(counts, max_length, max_examples, preset=bound, theta=t) for t in thetas]
        for bins in sorted(hybrids, key=lambda b: b.total_rows)[:SEARCHED]:
            hybrids[hybrids.index(bins)] = _fewest_presets(counts, max_length, max_examples, bins, bound)
        for bins in hybrids:
            candidates[bins.name] = bins.total_rows
            if bins.total_rows < best.total_rows:
                best = bins
    report: dict[str, Any] = {"rows_lower_bound": bound, "candidates": candidates}
    packing = best.packing(max_length)
    if packing.total_rows > bound and int(counts.sum()) <= EXACT_MAX_EXAMPLES:
        found, complete = _exact(counts, max_length, max_examples, packing.total_rows, bound)
        if found is not None:
            packing = _from_bins(found, max_length, "exact search")
        candidates["exact search"] = packing.total_rows
        report["exact_search_complete"] = complete
    report["method"] = packing.method
    report["proven_optimal"] = packing.total_rows == bound or bool(report.get("exact_search_complete"))
    return packing, report


def _fewest_presets(counts: np.ndarray, max_length: int, max_examples: int | None, bins: _Bins,
                    bound: int) -> _Bins:
    """Bisect the preset rows of a hybrid between the bound and its rows for the fewest that hold every
    example (more presets spread the long examples thinner); the best run found."""
    lo, hi = bound, bins.total_rows
    best = bins
    while lo < hi:
        mid = (lo + hi) // 2
        run = _pack(counts, max_length, max_examples, preset=mid, theta=bins.theta)
        if run.total_rows < best.total_rows:
            best = run
        if run.total_rows <= mid:
            hi = mid
        else:
            lo = mid + 1
    return best


class _Bins:
    """Bulk bin packing over counts: bins in classes of identical content, content kept as a trie of
    (size, count) steps, so each step moves a whole class and the state stays O(distinct lengths)."""

    def __init__(self, max_length: int, max_examples: int | None, preset: int = 0, theta: int | None = None) -> None:
        self.preset, self.theta = preset, theta
        self.L = max_length
        self.K = _NONE if max_examples is None else max_examples
        self.parent, self.size, self.count = [-1], [0], [0]
        self.r: list[int] = []
        """Remaining capacity of each bin of the class."""
        self.k: list[int] = []
        """Examples in each bin of the class."""
        self.m: list[int] = []
        """Bins in the class."""
        self.node: list[int] = []

    @property
    def total_rows(self) -> int:
        return sum(m for m, k in zip(self.m, self.k) if k)

    @property
    def name(self) -> str:
        if self.theta is None:
            return "best-fit decreasing"
        return f"worst-fit >= {self.theta} over {self.preset:,} rows, then best-fit"

    def step(self, c: int, s: int, q: int, bins: int | None = None) -> int:
        """`bins` bins of class c (all when None) each take q examples of length s; returns the class they
        are now (c itself when all move)."""
        node = len(self.parent)
        self.parent.append(self.node[c])
        self.size.append(s)
        self.count.append(q)
        if bins is None or bins == self.m[c]:
            self.r[c] -= q * s
            self.k[c] += q
            self.node[c] = node
            return c
        self.m[c] -= bins
        return self.new(self.r[c] - q * s, self.k[c] + q, bins, node)

    def new(self, r: int, k: int, m: int, node: int) -> int:
        self.r.append(r)
        self.k.append(k)
        self.m.append(m)
        self.node.append(node)
        return len(self.r) - 1

    def room(self, c: int) -> int:
        return self.K - self.k[c]

    def open(self, s: int, count: int) -> list[int]:
        """New bins for `count` examples of length s that fit nowhere: each takes as many as fit."""
        q = min(self.L // s if s else _NONE, self.K, count)
        full, rest = divmod(count, q)
        made = []
        for bins, take in ((full, q), (1 if rest else 0, rest)):
            if bins:
                c = self.new(self.L, 0, bins, 0)
                made.append(self.step(c, s, take))
        return made

    def packing(self, max_length: int) -> Packing:
        """The classes that hold examples, with their content read back from the trie."""
        entries: dict[tuple[int, int], int] = {}
        live = [c for c in range(len(self.m)) if self.m[c] and self.k[c]]
        for i, c in enumerate(live):
            node = self.node[c]
            while node > 0:
                key = (self.size[node], i)
                entries[key] = entries.get(key, 0) + self.count[node]
                node = self.parent[node]
        keys = sorted(entries)
        return Packing(max_length, np.array([self.m[c] for c in live], dtype=np.int64),
                       np.array([i for _, i in keys], dtype=np.int64), np.array([s for s, _ in keys], dtype=np.int64),
                       np.array([entries[k] for k in keys], dtype=np.int64), self.name)


def _pack(counts: np.ndarray, max_length: int, max_examples: int | None, preset: int = 0,
          theta: int | None = None) -> _Bins:
    """Lengths in decreasing order. Those >= theta go worst-fit (to the bin with the most room) over
    `preset` empty bins; the rest go best-fit (the bin with the least room that fits). Examples that fit
    nowhere open new bins. Ties go to the oldest class, so the result is a function of the counts."""
    bins = _Bins(max_length, max_examples, preset, theta)
    sizes = np.flatnonzero(counts)[::-1].tolist()
    i = 0
    if theta is not None and preset:
        heap: list[tuple[int, int, int, int]] = []

        def push(c: int) -> None:
            if bins.room(c) > 0:
                heapq.heappush(heap, (-bins.r[c], c, bins.m[c], bins.r[c]))

        def top() -> tuple[int, int, int, int] | None:
            while heap:
                _, c, m, r = heap[0]
                if bins.m[c] == m and bins.r[c] == r and bins.room(c) > 0:
                    return heap[0]
                heapq.heappop(heap)
            return None

        push(bins.new(max_length, 0, preset, 0))
        while i < len(sizes) and sizes[i] >= theta:
            s, left = sizes[i], int(counts[sizes[i]])
            i += 1
            while left:
                first = top()
                if first is None or first[3] < s:
                    for c in bins.open(s, left):
                        push(c)
                    break
                _, c, m, r = heapq.heappop(heap)
                second = top()
                # rounds of one example per bin while this class still has the most room
                rounds = min(r // s if s else _NONE, bins.room(c),
                             (r - second[3]) // s + 1 if s and second is not None else _NONE)
                if left >= m:
                    t = min(rounds, left // m)
                    push(bins.step(c, s, t))
                    left -= t * m
                else:
                    push(bins.step(c, s, 1, left))
                    push(c)
                    left = 0
    index: dict[int, deque[int]] = {}
    active: list[int] = []

    def add(c: int) -> None:
        if bins.room(c) <= 0 or not bins.m[c]:
            return
        queue = index.get(bins.r[c])
        if queue is None:
            queue = index[bins.r[c]] = deque()
            bisect.insort(active, bins.r[c])
        queue.append(c)

    def drop(r: int) -> None:
        queue = index[r]
        queue.popleft()
        if not queue:
            del index[r]
            active.pop(bisect.bisect_left(active, r))

    for c in range(len(bins.r)):
        add(c)
    for s in sizes[i:]:
        left = int(counts[s])
        while left:
            j = bisect.bisect_left(active, s)
            if j == len(active):
                for c in bins.open(s, left):
                    add(c)
                break
            r = active[j]
            c = index[r][0]
            q = min(r // s if s else _NONE, bins.room(c))
            m = bins.m[c]
            if q * m <= left:
                drop(r)
                add(bins.step(c, s, q))
                left -= q * m
                continue
            full, rest = divmod(left, q)
            drop(r)
            moved = [bins.step(c, s, q, full)] if full else []
            if rest:
                moved.append(bins.step(c, s, rest, 1))
            for x in dict.fromkeys([*moved, c]):
                add(x)
            left = 0
    return bins


def _exact(counts: np.ndarray, max_length: int, max_examples: int | None, best: int, bound: int
           ) -> tuple[list[list[int]] | None, bool]:
    """Branch and bound over placements (longest first; bins with the same room and count tried once),
    pruned by the room left in open bins. Returns the rows of a packing with fewer than `best` rows (None
    if there is none, or none was found within EXACT_NODES nodes) and whether the search was complete, in
    which case the result is optimal."""
    L, K = max_length, max_examples or _NONE
    items = np.repeat(np.arange(len(counts)), counts)[::-1].tolist()
    n = len(items)
    rest = np.concatenate([np.cumsum(items[::-1])[::-1], [0]]).tolist()
    room: list[int] = []
    held: list[list[int]] = []
    state = {"best": best, "found": None, "nodes": 0}

    def search(i: int) -> None:
        state["nodes"] += 1
        if i == n:
            state["best"], state["found"] = len(room), [list(b) for b in held]
            return
        free = sum(r for r, b in zip(room, held) if len(b) < K)
        need = len(room) + max(0, -(-(rest[i] - free) // L))
        if K < _NONE:
            need = max(need, len(room) + max(0, -(-(n - i - sum(K - len(b) for b in held)) // K)))
        if need >= state["best"]:
            return
        s = items[i]
        tried: set[tuple[int, int]] = set()
        for b in range(len(room)):
            shape = (room[b], len(held[b]))
            if room[b] >= s and len(held[b]) < K and shape not in tried:
                tried.add(shape)
                room[b] -= s
                held[b].append(s)
                search(i + 1)
                held[b].pop()
                room[b] += s
                if state["best"] <= bound or state["nodes"] > EXACT_NODES:
                    return
        if len(room) + 1 < state["best"]:
            room.append(L - s)
            held.append([s])
            search(i + 1)
            room.pop()
            held.pop()

    search(0)
    return state["found"], state["nodes"] <= EXACT_NODES


def _from_bins(rows: Sequence[Sequence[int]], max_length: int, method: str) -> Packing:
    """A plan from explicit rows of lengths (one class per distinct row)."""
    classes: dict[tuple[int, ...], int] = {}
    for row in rows:
        key = tuple(sorted(row))
        classes[key] = classes.get(key, 0) + 1
    entries = sorted((s, i, key.count(s)) for i, key in enumerate(classes) for s in set(key))
    return Packing(max_length, np.array(list(classes.values()), dtype=np.int64),
                   np.array([e[1] for e in entries], dtype=np.int64), np.array([e[0] for e in entries], dtype=np.int64),
                   np.array([e[2] for e in entries], dtype=np.int64), method)


def first_fit(lengths: Sequence[int], max_length: int, max_examples: int | None = None) -> np.ndarray:
    """Greedy first-fit in arrival order (each example into the first row it fits), as online packers do:
    the row of each example. The reference `pack` is measured against; O(n log rows) with a max-tree."""
    K = max_examples or _NONE
    size = 1
    while size < max(1, len(lengths)):
        size *= 2
    tree = [-1] * (2 * size)
    held: list[int] = []
    out = np.empty(len(lengths), dtype=np.int64)
    for i, s in enumerate(lengths):
        if tree[1] >= s:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= s else 2 * node + 1
            row = node - size
        else:
            row = len(held)
            held.append(0)
            node = row + size
            tree[node] = max_length
        held[row] += 1
        out[i] = row
        tree[node] = tree[node] - s if held[row] < K else -1
        node //= 2
        while node:
            a, b = tree[2 * node], tree[2 * node + 1]
            tree[node] = a if a > b else b
            node //= 2
    return out
