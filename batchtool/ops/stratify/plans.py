"""stratify's plans: target proportions, the exact per-class totals and Bernoulli rates, and the pure
functions from a chunk's labels and ids to copies per example."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Union

import numpy as np

from batchtool.core import rng
from batchtool.core.errors import OptionError
from batchtool.io.dataset import Chunk
from batchtool.ops.copies import MAX_RATE
from batchtool.ops.labels import Locate, label_codes
from batchtool.ops.stratify.options import StratifyOptions
from batchtool.ops.targets import Target

STAGE = "stratify"


# -- plans: pure functions from a chunk's labels and ids to copies per example -----------------------------------


@dataclass(frozen=True)
class ThresholdPlan:
    """Exact mode: every example of class i gets base[i] copies, plus one more if its keyed hash is
    <= thresholds[i] (exactly the class's k_i smallest hashes; None: no example gets one)."""

    base: tuple[int, ...]
    thresholds: tuple[int | None, ...]

    def copies(self, labels: np.ndarray, ids: np.ndarray, seed: int) -> np.ndarray:
        has = np.array([t is not None for t in self.thresholds])
        limit = np.array([t or 0 for t in self.thresholds], dtype=np.uint64)
        extra = has[labels] & (rng.keyed_hash(seed, STAGE, ids) <= limit[labels])
        return np.asarray(self.base, dtype=np.int64)[labels] + extra


@dataclass(frozen=True)
class RatePlan:
    """Bernoulli, online and Bernoulli-with-replacement: an example of class i gets floor(r_i) copies
    plus one more with probability frac(r_i), from its keyed uniform."""

    rates: tuple[float, ...]

    def copies(self, labels: np.ndarray, ids: np.ndarray, seed: int) -> np.ndarray:
        r = np.asarray(self.rates, dtype=np.float64)[labels]
        whole = np.floor(r)
        return whole.astype(np.int64) + (rng.uniform(seed, STAGE, ids) < r - whole)


Plan = Union[ThresholdPlan, RatePlan]


def acceptance_probs(init_probs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """`stratified_sample`'s a_i = (t_i / p_i) / max_j (t_j / p_j); a class with p_i = 0 (and so t_i = 0) gets 0."""
    ratio = np.divide(target, init_probs, out=np.zeros_like(target), where=init_probs > 0)
    return ratio / ratio.max()


def exact_target(target: Target, num_classes: int) -> list[Fraction]:
    """The target as exact fractions of the decimals as written, normalised to sum to exactly 1, so that
    floor(M * t_i) is never one short where a float product falls just below an integer (300 * 0.3)."""
    if isinstance(target, str):
        raw = [Fraction(1)] * num_classes
    elif isinstance(target, dict):
        raw = [Fraction(repr(float(target.get(i, 0.0)))) for i in range(num_classes)]
    else:
        raw = [Fraction(repr(float(p))) for p in target]
    total = sum(raw)
    return [r / total for r in raw]


def largest_total(counts: np.ndarray, target: Sequence[Fraction]) -> Fraction:
    """M = min_i n_i / t_i over the classes with t_i > 0: the largest total every class can supply its
    share of, so floor(M * t_i) <= n_i, the scarcest class is taken whole, and the proportions are exact
    whenever the counts allow them (2709/199/62/30 at 0.4/0.3/0.2/0.1: M = 300, 120/90/60/30)."""
    return min(Fraction(int(n)) / t for n, t in zip(counts.tolist(), target) if t > 0)


def check_copies(total: int, counts: np.ndarray, target: np.ndarray, options: StratifyOptions) -> None:
    """With --replacement each example of class i is written about total * t_i / n_i times: at most MAX_RATE."""
    copies = np.divide(float(total) * target, counts, out=np.zeros_like(target), where=counts > 0)
    i = int(np.argmax(copies))
    if copies[i] > MAX_RATE:
        given = f"{{size}} {options.size:,}" if options.size else f"the input size {total:,}"
        raise OptionError("size", f"{given} with {{replacement}}: each of the {int(counts[i]):,} examples of class {i} "
                          f"would be written about {copies[i]:.4g} times, more than {MAX_RATE:.10g} copies of one "
                          "example; give a smaller {size}", mentions=("replacement",))


def exact_totals(counts: np.ndarray, target: np.ndarray, options: StratifyOptions) -> tuple[np.ndarray, Fraction]:
    """Output examples per class, floor(M * t_i) in exact arithmetic, and M: min_i n_i / t_i (or --size);
    with --replacement M is --size or the input size."""
    exact = exact_target(options.target, len(counts))
    if options.replacement:
        m = Fraction(options.size or int(counts.sum()))
        check_copies(int(m), counts, target, options)
    else:
        m = largest_total(counts, exact)
        if options.size is not None:
            if options.size > m:
                raise OptionError("size", f"without {{replacement}} the data allows at most {math.floor(m):,} examples "
                                  f"at these proportions (class counts {counts.tolist()})", value=str(options.size),
                                  mentions=("replacement",))
            m = Fraction(options.size)
    return np.array([math.floor(m * t) for t in exact], dtype=np.int64), m


def replacement_rates(counts: np.ndarray, target: np.ndarray, options: StratifyOptions) -> np.ndarray:
    """Bernoulli with replacement: r_i = N * t_i / n_i expected copies, N = --size or the input size."""
    total = options.size or int(counts.sum())
    check_copies(total, counts, target, options)
    return np.divide(float(total) * target, counts, out=np.zeros_like(target), where=counts > 0)


def threshold_plan(totals: np.ndarray, counts: np.ndarray, find: Callable[[dict[int, int]], dict[int, int]]
                   ) -> ThresholdPlan:
    """base_i = T_i // n_i copies for all, one more for the T_i % n_i examples with the smallest hashes."""
    base = np.floor_divide(totals, np.maximum(counts, 1))
    extra = totals - base * counts
    found = find({i: int(k) for i, k in enumerate(extra.tolist()) if k > 0})
    return ThresholdPlan(tuple(base.tolist()), tuple(found.get(i) for i in range(len(totals))))


@dataclass(frozen=True)
class Stratification:
    """What the first passes decide: the classes, the target and the plan (None for --mode online, which
    plans chunk by chunk as it streams). `info` is what the manifest records about them."""

    options: StratifyOptions
    num_classes: int
    target: np.ndarray
    plan: Plan | None
    expected_rows: float | None
    info: dict[str, Any]
    seed: int
    locate: Locate
    memory: int
    """--memory, which bounds a batch and sizes the balanced batches' spill."""
    tasks: int = 1
    """Key ranges sorted at once (ops.base.Context.tasks): with --memory, what sizes its spill's key ranges."""
    seen: np.ndarray | None = None
    """--mode online: the class counts (plus ONLINE_PRIOR) up to and including this chunk."""

    def labels(self, chunk: Chunk) -> np.ndarray:
        return label_codes(chunk, self.options.label, self.num_classes, self.locate)

    def expected(self) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows (exact mode fixes them) and the plan's numbers."""
        shown = {k: self.info[k] for k in ("num_classes", "input_probs", "class_targets", "acceptance_probs",
                                           "rates") if k in self.info}
        exact = self.options.mode == "exact"
        rows = None if self.expected_rows is None else round(self.expected_rows)
        return (rows if exact else None), {**shown, **({} if exact or rows is None else {"expected_rows": rows})}


__all__ = ["Plan", "RatePlan", "STAGE", "Target", "ThresholdPlan", "acceptance_probs", "check_copies", "exact_target", "exact_totals", "largest_total", "replacement_rates", "threshold_plan"]
