"""Statistics of some chunks, merged in input order, so that totals never depend on threads or engine."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

def _add_counter(total: Counter, value: Counter) -> None:
    """total + value in place, as Counter's + gives it for counts (positive: only positive counts are kept), in the
    time of `value`."""
    total.update(value)
    for key, count in value.items():
        if count <= 0 and total[key] <= 0:
            del total[key]


@dataclass
class Tally:
    """Statistics of some chunks: a kernel returns its chunk's, the driver merges them in input order (`merge`),
    so totals never depend on threads or engine. Counts (numbers or NumPy arrays) add; value sums go through
    math.fsum, min and max commute; `latest` keeps the last chunk's value (a running estimate)."""

    counts: dict[str, Any] = field(default_factory=dict)
    sums: dict[str, list[float]] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)
    latest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **counts: Any) -> Tally:
        tally = cls()
        tally.add(**counts)
        return tally

    def add(self, **counts: Any) -> None:
        for name, value in counts.items():
            if isinstance(value, Counter) and name in self.counts:  # in place: a new Counter per chunk made
                _add_counter(self.counts[name], value)                # merging quadratic
            elif isinstance(value, Counter):
                self.counts[name] = Counter(value)  # its own copy: added to in place from here on
            else:
                self.counts[name] = self.counts[name] + value if name in self.counts else value

    def add_values(self, name: str, values: np.ndarray) -> None:
        if len(values):
            self.sums.setdefault(name, []).append(float(values.sum()))
            self.low[name] = min(self.low.get(name, math.inf), float(values.min()))
            self.high[name] = max(self.high.get(name, -math.inf), float(values.max()))

    def merge(self, other: Tally) -> None:
        """Add the statistics of the chunks after these."""
        self.add(**other.counts)
        for name, sums in other.sums.items():
            self.sums.setdefault(name, []).extend(sums)
            self.low[name] = min(self.low.get(name, math.inf), other.low[name])
            self.high[name] = max(self.high.get(name, -math.inf), other.high[name])
        self.latest.update(other.latest)

    def total(self, name: str) -> float:
        return math.fsum(self.sums.get(name, []))

    def summary(self, name: str, count: int) -> dict[str, float]:
        if name not in self.sums:
            return {}
        return {"mean": self.total(name) / max(count, 1), "min": self.low[name], "max": self.high[name]}

    def count(self, name: str) -> int:
        return int(self.counts.get(name, 0))


