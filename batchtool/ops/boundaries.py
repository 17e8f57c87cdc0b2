"""Length buckets: TensorFlow's bucket_by_sequence_length assignment, and boundaries that minimise padding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from array import array
from collections import deque
from collections.abc import Sequence

from batchtool.core.errors import OptionError

if TYPE_CHECKING:  # arrays are imported where the functions run: options declared from here make --help
    import numpy as np

CHOICE_BYTES = 4
"""Memory of `choose_boundaries` per (bucket, distinct length): where each bucket's best start is."""


def check_boundaries(boundaries: Sequence[int], field: str = "boundaries") -> tuple[int, ...]:
    """`bucket_by_sequence_length`'s rule: a non-empty list of strictly increasing non-negative integers."""
    import numpy as np

    values = tuple(boundaries)
    text = ",".join(str(b) for b in values)
    if not values:
        raise OptionError(field, f"{{{field}}} is empty: give at least one length, e.g. {{{field}}} 64,128,256")
    if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) for b in values):
        raise OptionError(field, "boundaries must be integers", value=text)
    if min(values) < 0:
        raise OptionError(field, "boundaries must be non-negative", value=text)
    bad = next((i for i in range(1, len(values)) if values[i] <= values[i - 1]), None)
    if bad is not None:
        raise OptionError(field, f"boundaries must be strictly increasing ({values[bad - 1]} is followed by "
                          f"{values[bad]})", value=text)
    return tuple(int(b) for b in values)


def assign_buckets(lengths: np.ndarray, boundaries: Sequence[int]) -> np.ndarray:
    """Bucket per length: 0 for `< b[0]`, i + 1 for `[b[i], b[i+1])`, len(b) for `>= b[-1]` (TensorFlow's buckets)."""
    import numpy as np

    return np.searchsorted(np.asarray(boundaries, dtype=np.int64), lengths, side="right").astype(np.int32)


def padded_elements(length_counts: np.ndarray, boundaries: Sequence[int]) -> int:
    """The proxy cost boundaries are chosen by: every example padded to the longest length of its bucket.

    This is the exact cost of padding to the bucket boundary when each boundary is one more
    than its bucket's longest length (as chosen here), and an upper bound on dynamic padding,
    whose batches are padded to their own longest example.
    """
    import numpy as np

    counts = np.asarray(length_counts, dtype=np.int64)
    values = np.flatnonzero(counts)
    buckets = assign_buckets(values, boundaries)
    longest = np.zeros(len(boundaries) + 1, dtype=np.int64)
    np.maximum.at(longest, buckets, values)
    return int((counts[values] * longest[buckets]).sum())


def real_elements(length_counts: np.ndarray) -> int:
    import numpy as np

    counts = np.asarray(length_counts, dtype=np.int64)
    return int((np.arange(len(counts)) * counts).sum())


def efficiency(real: int, padded: int) -> float | None:
    """Real / padded elements; None when nothing is padded (all lengths zero, or no examples)."""
    return round(real / padded, 6) if padded else None


def expected_efficiency(length_counts: np.ndarray, boundaries: Sequence[int]) -> float | None:
    return efficiency(real_elements(length_counts), padded_elements(length_counts, boundaries))


def choose_boundaries(length_counts: np.ndarray, k: int) -> tuple[int, ...]:
    """The at most k - 1 boundaries (k buckets) that minimise `padded_elements` over this histogram, exactly.

    A bucket is a run of consecutive distinct lengths v[i..j-1] costing (examples in it) * v[j-1].
    Dynamic programme over distinct lengths, one layer per bucket:
    cost_m(j) = min_i cost_{m-1}(i) + (P(j) - P(i)) * v[j-1], P = prefix counts. For fixed j this is
    the lower envelope of lines y = cost_{m-1}(i) - P(i) * x at x = v[j-1]; slopes fall as i grows and
    x rises with j, so a monotone deque (convex hull trick) finds it in O(1) amortised: O(k * L) time
    and CHOICE_BYTES * k * L bytes for L distinct lengths, in exact integer arithmetic. Each boundary is
    one more than the longest length of the bucket below it, so padding to the boundary costs exactly
    this optimum.
    """
    import numpy as np

    if k < 1:
        raise OptionError("auto_buckets", "must be at least 1", value=str(k))
    counts = np.asarray(length_counts, dtype=np.int64)
    values = np.flatnonzero(counts).tolist()
    groups = min(k, len(values))
    if groups <= 1:
        return ()
    prefix = [0, *np.cumsum(counts[values]).tolist()]
    n = len(values)
    cost = [0] + [prefix[j] * values[j - 1] for j in range(1, n + 1)]
    starts: list[array] = []
    for m in range(2, groups + 1):
        layer, start = [0] * (n + 1), array("i", bytes(CHOICE_BYTES * (n + 1)))
        hull: deque[tuple[int, int, int]] = deque()  # (slope, intercept, i)
        for j in range(m, n + 1):
            _add_line(hull, -prefix[j - 1], cost[j - 1], j - 1)
            x = values[j - 1]
            while len(hull) > 1 and hull[1][0] * x + hull[1][1] <= hull[0][0] * x + hull[0][1]:
                hull.popleft()
            slope, intercept, i = hull[0]
            layer[j], start[j] = slope * x + intercept + prefix[j] * x, i
        cost = layer
        starts.append(start)
    ends, j = [], n
    for start in reversed(starts):
        j = start[j]
        ends.append(j)
    return tuple(values[i - 1] + 1 for i in sorted(ends))


def _add_line(hull: deque[tuple[int, int, int]], slope: int, intercept: int, i: int) -> None:
    """Append a line of smaller slope, dropping lines that are now nowhere the minimum."""
    while len(hull) > 1:
        (s1, b1, _), (s2, b2, _) = hull[-2], hull[-1]
        # hull[-1] is useless if the new line overtakes hull[-2] no later than hull[-1] does
        if (intercept - b1) * (s1 - s2) <= (b2 - b1) * (s1 - slope):
            hull.pop()
        else:
            break
    hull.append((slope, intercept, i))


def quantile_boundaries(length_counts: np.ndarray, k: int) -> tuple[int, ...]:
    """k equal-count buckets (fairseq-style quantiles): the reference auto-buckets must beat.

    Boundary i is one more than the lower i/k quantile of the lengths; duplicates collapse.
    """
    import numpy as np

    counts = np.asarray(length_counts, dtype=np.int64)
    total = int(counts.sum())
    if not total or k <= 1:
        return ()
    cum = np.cumsum(counts)
    cuts = [int(np.searchsorted(cum, i * total / k, side="left")) + 1 for i in range(1, k)]
    return tuple(sorted({c for c in cuts if c <= len(counts) - 1}))
