"""`stratify`: resample to target class proportions (exact, Bernoulli, online, with replacement, balanced batches)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool import budget, rng
from batchtool import stats as stats_mod
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import InputError, SchemaError, UsageError, where
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.quotas import QuotaLayout, plan_layout
from batchtool.ops.base import Tally
from batchtool.ops.resample import MAX_RATE, Copies, Piece, copy_stats, copy_summary, merged, pieces
from batchtool.ops.shuffle import (DEFAULT_MEMORY, PART_SHARE, RowReader, bytes_per_row, emit, estimate_memory_bytes,
                                   keyed_spill, manifest_options, peek, rebatch, spill_streams)
from batchtool.output import OutputOptions
from batchtool.runner import ordered_map
from batchtool.spill import parts_for

STAGE = "stratify"
MODES = ("exact", "bernoulli", "online")
PROB_TOLERANCE = 1e-6
"""How far from 1 a list of probabilities may sum (`tf.contrib.training.stratified_sample`'s tolerance)."""
ONLINE_PRIOR = 10
"""Pseudo-count of every class before any label is seen (`stratified_sample_unknown_dist`'s smoothing constant)."""
SELECT_BUDGET = 1 << 22
"""Keyed hashes held at once while finding the exact per-class thresholds (32 MiB)."""
HIST_BITS = 16
MAX_CLASSES = 1 << 16
"""Most classes, given (--num-classes, --target) or inferred from the data: every input chunk counts its
labels in an array of one entry per class."""

Target = Union[str, tuple[float, ...], dict[int, float]]
Locate = Callable[[int], str]


# -- options ---------------------------------------------------------------------------------------------------


def parse_probs(text: str, flag: str) -> tuple[float, ...]:
    """'0.5,0.3,0.2' -> (0.5, 0.3, 0.2)."""
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated probabilities, e.g. 0.5,0.3,0.2") from None


def parse_target(text: str) -> Target:
    """--target: 'uniform', 'P0,P1,...' or 'class=prob' pairs such as '0=0.5,3=0.5' (unnamed classes get 0)."""
    text = text.strip()
    if text.lower() == "uniform":
        return "uniform"
    if "=" not in text:
        return parse_probs(text, "--target")
    pairs: dict[int, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = item.partition("=")
        try:
            cls, prob = int(name), float(value)
        except ValueError:
            cls = prob = None
        if not sep or cls is None or cls < 0 or cls in pairs:
            raise UsageError(f"--target {text!r}: {item!r} is not a new CLASS=PROB pair with CLASS an integer >= 0")
        pairs[cls] = prob
    return pairs


def check_probs(values: Iterable[float], flag: str) -> None:
    """`stratified_sample`'s checks: probabilities >= 0 that sum to one within PROB_TOLERANCE."""
    values = list(values)
    shown = ",".join(f"{v:g}" for v in values)
    if not values:
        raise UsageError(f"{flag}: no probabilities given")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise UsageError(f"{flag} {shown}: probabilities must be >= 0 (value {i} is {v:g})")
    total = math.fsum(values)
    if abs(total - 1.0) > PROB_TOLERANCE:
        raise UsageError(f"{flag} {shown}: probabilities sum to {total:.9g}, expected 1 "
                         f"(tolerance {PROB_TOLERANCE:g})")


@dataclass(frozen=True)
class StratifyOptions:
    """What `stratify` computes; `memory` and `tmp_dir` only bound the balanced-batch spill."""

    label: str = "label"
    target: Target = "uniform"
    mode: str = "exact"
    init_probs: tuple[float, ...] | None = None
    num_classes: int | None = None
    replacement: bool = False
    size: int | None = None
    batch_size: int | None = None
    balanced_batches: bool = False
    drop_remainder: bool = False
    memory: int = DEFAULT_MEMORY
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if isinstance(self.target, str) and self.target != "uniform":
            raise UsageError(f"--target {self.target!r}: expected 'uniform', P0,P1,... or CLASS=PROB pairs")
        if not isinstance(self.target, str):
            check_probs(self.target.values() if isinstance(self.target, dict) else self.target, "--target")
        if self.init_probs is not None:
            if self.mode != "bernoulli":
                raise UsageError(f"--init-probs applies to --mode bernoulli (--mode {self.mode} "
                                 + ("counts the classes first)" if self.mode == "exact" else "estimates them)"))
            check_probs(self.init_probs, "--init-probs")
        if self.num_classes is not None and self.num_classes < 1:
            raise UsageError(f"--num-classes {self.num_classes}: must be at least 1")
        self._check_class_counts()
        if self.replacement and self.mode == "online":
            raise UsageError("--replacement needs the class counts: use --mode exact or bernoulli")
        if self.mode == "online":
            self.known_classes()
        if self.replacement and self.init_probs is not None:
            raise UsageError("--replacement counts the classes itself; drop --init-probs")
        if self.size is not None and (self.size < 1 or (self.mode != "exact" and not self.replacement)):
            raise UsageError(f"--size {self.size}: must be >= 1, with --mode exact or --replacement")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size}: must be at least 1")
        if (self.balanced_batches or self.drop_remainder) and self.batch_size is None:
            flag = "--balanced-batches" if self.balanced_batches else "--drop-remainder"
            raise UsageError(f"{flag} needs --batch-size")
        if self.memory <= 0:
            raise UsageError(f"--memory {self.memory}: must be a positive size")

    def _check_class_counts(self) -> None:
        """--target list, --num-classes and --init-probs must agree on the number of classes, at most MAX_CLASSES."""
        named = max(self.target) + 1 if isinstance(self.target, dict) and self.target else 0
        for flag, n in (("--num-classes", self.num_classes or 0), ("--target", named)):
            if n > MAX_CLASSES:
                raise UsageError(f"{flag}: {n:,} classes; at most {MAX_CLASSES:,} (every chunk counts its labels "
                                 "per class)")
        sizes = {flag: n for flag, n in (
            ("--target", len(self.target) if isinstance(self.target, tuple) else None),
            ("--num-classes", self.num_classes),
            ("--init-probs", len(self.init_probs) if self.init_probs is not None else None)) if n is not None}
        if len(set(sizes.values())) > 1:
            raise UsageError("the number of classes disagrees: "
                             + ", ".join(f"{flag} gives {n}" for flag, n in sizes.items()))
        if isinstance(self.target, dict) and sizes and max(self.target) >= min(sizes.values()):
            raise UsageError(f"--target names class {max(self.target)} but there are only "
                             f"{min(sizes.values())} classes (0..{min(sizes.values()) - 1})")

    def known_classes(self) -> int | None:
        """The number of classes if the options fix it (else the counting pass finds it)."""
        if isinstance(self.target, tuple):
            return len(self.target)
        if self.num_classes is not None:
            return self.num_classes
        if self.init_probs is not None:
            return len(self.init_probs)
        if self.mode == "online" and isinstance(self.target, dict):
            return max(self.target) + 1
        if self.mode == "online":
            raise UsageError("--target uniform with --mode online needs --num-classes "
                             "(there is no counting pass to find the classes)")
        return None

    @property
    def needs_counts(self) -> bool:
        return self.mode == "exact" or (self.mode == "bernoulli" and self.init_probs is None)


def target_vector(target: Target, num_classes: int) -> np.ndarray:
    """Target proportions per class, normalised to sum to exactly 1 (after the tolerance check)."""
    if isinstance(target, str):
        t = np.full(num_classes, 1.0 / num_classes)
    elif isinstance(target, dict):
        t = np.zeros(num_classes)
        for cls, prob in target.items():
            t[cls] = prob
    else:
        t = np.asarray(target, dtype=np.float64)
    return t / t.sum()


# -- labels -----------------------------------------------------------------------------------------------------


class LabelError(InputError):
    """Labels that are null, not integers, or outside [0, num_classes): how many and the first one."""

    def __init__(self, column: str, num_classes: int, count: int, first: str) -> None:
        self.first = first
        super().__init__(f"column {column!r}: {count:,} label(s) are not integers in [0, {num_classes}) "
                         f"(first: {first})")


def check_label_type(dataset: Dataset, column: str) -> None:
    dataset.check_columns([column])
    t = dataset.schema.field(column).type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        path = dataset.shards[0].path if dataset.shards else dataset.src
        raise SchemaError(f"{where(path, column=column)}: type {t}, but labels must be integers in [0, num_classes)")


def label_codes(chunk: Chunk, column: str, num_classes: int, locate: Locate) -> np.ndarray:
    """Labels as int64 class indices; a null, fractional or out-of-range label raises LabelError."""
    arr = chunk.data.column(column)
    values = pc.fill_null(pc.cast(arr, pa.float64()), math.nan).to_numpy(zero_copy_only=False)
    if pa.types.is_integer(arr.type):
        codes = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = (codes < 0) | (codes >= num_classes) | np.isnan(values)
    else:
        bad = ~(np.isfinite(values) & (values == np.floor(values)) & (values >= 0) & (values < num_classes))
        codes = np.where(bad, 0, values).astype(np.int64)
    if bad.any():
        i = int(np.argmax(bad))
        value = arr[i].as_py() if arr[i].is_valid else "null"
        raise LabelError(column, num_classes, int(bad.sum()), f"{locate(chunk.ids[i])}: {value}")
    return codes


def _is_class(value: Any, num_classes: int) -> bool:
    return isinstance(value, (int, float)) and float(value).is_integer() and 0 <= value < num_classes


def full_label_error(dataset: Dataset, column: str, num_classes: int, threads: int,
                     counted: stats_mod.DatasetStats | None = None) -> LabelError:
    """The error over the whole dataset: how many labels are bad (counting pass) and the first one."""
    counted = counted or stats_mod.collect(dataset, label=column, threads=threads)
    count = counted.label_nulls + sum(n for v, n in counted.label_counts.items() if not _is_class(v, num_classes))
    for chunk in dataset.chunks([column], threads):
        try:
            label_codes(chunk, column, num_classes, dataset.locate)
        except LabelError as exc:
            return LabelError(column, num_classes, count, exc.first)
    raise AssertionError("the counting pass saw bad labels that the scan did not find")


def classes_from_data(counted: stats_mod.DatasetStats, options: StratifyOptions) -> int:
    """Uniform and class=prob targets without --num-classes: classes 0..(largest label seen)."""
    seen = [int(v) for v in counted.label_counts if isinstance(v, (int, float)) and float(v).is_integer() and v >= 0]
    largest = max(seen + ([max(options.target)] if isinstance(options.target, dict) else []), default=0)
    if largest >= MAX_CLASSES:
        raise InputError(f"column {options.label!r}: labels go up to {largest}; pass --num-classes or a "
                         "--target list if there really are that many classes")
    return largest + 1


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


def check_zero_classes(init_probs: np.ndarray, target: np.ndarray, source: str) -> None:
    """`stratified_sample`'s error: a class with zero initial probability cannot reach a non-zero target."""
    for i in np.flatnonzero((init_probs <= 0) & (target > 0)):
        raise (UsageError if source == "--init-probs" else InputError)(
            f"class {i} has initial probability 0 ({source}) but --target gives it {target[i]:g}: "
            "a class with no examples cannot be sampled")


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
        given = f"--size {options.size:,}" if options.size else f"the input size {total:,}"
        raise UsageError(f"{given} with --replacement: each of the {int(counts[i]):,} examples of class {i} would be "
                         f"written about {copies[i]:.4g} times, more than {MAX_RATE:.10g} copies of one example; "
                         "give a smaller --size")


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
                raise UsageError(f"--size {options.size}: without --replacement the data allows at most "
                                 f"{math.floor(m):,} examples at these proportions (class counts {counts.tolist()})")
            m = Fraction(options.size)
    return np.array([math.floor(m * t) for t in exact], dtype=np.int64), m


def replacement_rates(counts: np.ndarray, target: np.ndarray, options: StratifyOptions) -> np.ndarray:
    """Bernoulli with replacement: r_i = N * t_i / n_i expected copies, N = --size or the input size."""
    total = options.size or int(counts.sum())
    check_copies(total, counts, target, options)
    return np.divide(float(total) * target, counts, out=np.zeros_like(target), where=counts > 0)


# -- exact thresholds ----------------------------------------------------------------------------------------------


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


def find_thresholds(dataset: Dataset, column: str, num_classes: int, ranks: dict[int, int], counts: np.ndarray,
                    seed: int, threads: int, budget: int = SELECT_BUDGET) -> dict[int, int]:
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
        def window_task(task: Callable[[], Chunk], windows: dict = windows) -> dict[int, np.ndarray]:
            return window_chunk(task(), column, num_classes, windows, seed, dataset.locate)

        for result in ordered_map(window_task, dataset.tasks([column]), threads):
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


def threshold_plan(totals: np.ndarray, counts: np.ndarray, find: Callable[[dict[int, int]], dict[int, int]]
                   ) -> ThresholdPlan:
    """base_i = T_i // n_i copies for all, one more for the T_i % n_i examples with the smallest hashes."""
    base = np.floor_divide(totals, np.maximum(counts, 1))
    extra = totals - base * counts
    found = find({i: int(k) for i, k in enumerate(extra.tolist()) if k > 0})
    return ThresholdPlan(tuple(base.tolist()), tuple(found.get(i) for i in range(len(totals))))


# -- balanced batches ---------------------------------------------------------------------------------------------


def balanced_batches(streams: list[RowReader], layout: QuotaLayout, seed: int, schema: pa.Schema) -> Iterator[Chunk]:
    """Each batch takes its quota from every class's keyed random stream and is shuffled by keyed order.

    The class streams are uniformly random, so consecutive batches are already in random order."""
    for quotas in layout.sequence():
        batch = Chunk.concat([streams[c].take(int(q)) for c, q in enumerate(quotas) if q], schema)
        yield batch.take(np.argsort(rng.permutation_keys(seed, STAGE + "/batch", batch.ids), kind="stable"))


# -- entry point ---------------------------------------------------------------------------------------------------


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

    def expected(self) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows (exact mode fixes them) and the plan's numbers."""
        shown = {k: self.info[k] for k in ("num_classes", "input_probs", "class_targets", "acceptance_probs",
                                           "rates") if k in self.info}
        exact = self.options.mode == "exact"
        rows = None if self.expected_rows is None else round(self.expected_rows)
        return (rows if exact else None), {**shown, **({} if exact or rows is None else {"expected_rows": rows})}


def resolve(dataset: Dataset, options: StratifyOptions, seed: int, threads: int) -> Stratification:
    """The first passes over the label column only: class counts (unless --init-probs or --mode online
    make them unnecessary), then, in exact mode, the per-class thresholds."""
    check_label_type(dataset, options.label)
    num_classes = options.known_classes()
    counted = None
    if options.needs_counts:
        counted = stats_mod.collect(dataset, label=options.label, threads=threads)
        num_classes = num_classes or classes_from_data(counted, options)
        if counted.label_nulls or any(not _is_class(v, num_classes) for v in counted.label_counts):
            raise full_label_error(dataset, options.label, num_classes, threads, counted)
    target = target_vector(options.target, num_classes)
    info: dict[str, Any] = {"label": options.label, "mode": options.mode, "replacement": options.replacement,
                            "num_classes": num_classes, "target": target.tolist()}
    plan: Plan | None = None
    expected_rows: float | None = None
    if options.mode != "online":
        plan, expected_rows = _plan(dataset, options, counted, num_classes, target, seed, threads, info)
    return Stratification(options, num_classes, target, plan, expected_rows, info)


@dataclass
class Selection:
    """Applying a stratification to a dataset's chunks; the statistics the manifest reports are merged into
    `tally` on the driver, in input order (the per-chunk functions sent to workers are pure)."""

    dataset: Dataset
    strat: Stratification
    seed: int
    tally: Tally = field(default_factory=Tally)
    online_final_probs: list[float] | None = None
    """--mode online: the class distribution estimated from every label read."""

    @property
    def options(self) -> StratifyOptions:
        return self.strat.options

    @property
    def num_classes(self) -> int:
        return self.strat.num_classes

    def items(self, threads: int, report: ReadReport,
              columns: Sequence[str] | None = None) -> Iterable[tuple[Callable[[], Chunk], Plan]]:
        """(read task, plan) per input chunk, in order; --mode online plans each chunk from those before it."""
        if self.strat.plan is None:
            return self.online_items(threads, report, columns)
        return ((task, self.strat.plan) for task in self.dataset.tasks(columns, report))

    def online_items(self, threads: int, report: ReadReport,
                     columns: Sequence[str] | None = None) -> Iterator[tuple[Callable[[], Chunk], Plan]]:
        """--mode online: chunk c's acceptance probabilities come from the label counts of chunks 0..c in input
        order (plus ONLINE_PRIOR per class), so they do not depend on threads."""
        label, num_classes = self.options.label, self.num_classes
        seen = np.full(num_classes, float(ONLINE_PRIOR))
        for chunk in self.dataset.chunks(columns, threads, report):
            seen += np.bincount(label_codes(chunk, label, num_classes, self.dataset.locate), minlength=num_classes)
            self.online_final_probs = (seen / seen.sum()).tolist()
            yield (lambda c=chunk: c), RatePlan(tuple(acceptance_probs(seen / seen.sum(), self.strat.target).tolist()))

    def select(self, item: tuple[Callable[[], Chunk], Plan]) -> tuple[Copies, Tally]:
        """Read one chunk and apply its plan: the copies of each row (rows built by `build`) and the chunk's
        statistics; pure, runs on the engine's workers."""
        source, plan = item
        chunk = source()
        labels = label_codes(chunk, self.options.label, self.num_classes, self.dataset.locate)
        copies = plan.copies(labels, chunk.ids, self.seed)
        tally = copy_stats(copies)
        k = self.num_classes
        tally.add(class_in=np.bincount(labels, minlength=k),
                  class_selected=np.bincount(labels, weights=copies, minlength=k).astype(np.int64))
        return Copies(chunk, copies), tally

    def pieces(self, items: Iterable[tuple[Callable[[], Chunk], Plan]], threads: int) -> Iterator[Piece]:
        """The selection in order, as pieces of bounded size (see resample.Copies.pieces)."""
        return pieces(merged(ordered_map(self.select, items, threads), self.tally))

    def build(self, piece: Piece) -> tuple[Chunk, int]:
        """One piece's output rows (copies consecutive) and the input rows it completes."""
        return piece.build(self.seed, STAGE), piece.rows

    def build_batch(self, piece: Piece) -> tuple[list[pa.RecordBatch], int]:
        """No --batch-size: each piece (an input chunk's selection, unless copies multiply it) is a row group."""
        out, rows = self.build(piece)
        return ([out.data] if out.num_rows else []), rows

    def counted(self, batches: Iterable[Chunk]) -> Iterator[Chunk]:
        """The batches as they go to the writer, their classes counted here (on the driver, in order)."""
        for chunk in batches:
            self.tally.add(class_out=np.bincount(label_codes(chunk, self.options.label, self.num_classes,
                                                             self.dataset.locate), minlength=self.num_classes))
            yield chunk

    def stats(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """manifest["stats"]: the plan, class counts before and after, copies and what was discarded."""
        tally, zeros = self.tally, np.zeros(self.num_classes)
        written = tally.counts.get("class_out", tally.counts.get("class_selected", zeros))
        online = {} if self.online_final_probs is None else {"online_final_probs": self.online_final_probs}
        result = {**self.strat.info, **online, **copy_summary(tally),
                  "class_counts_before": _by_class(tally.counts.get("class_in", zeros)),
                  "class_counts_after": _by_class(written), **(extra or {})}
        lost = tally.count("examples_dropped") + int(np.sum(tally.counts.get("class_selected", 0))) - \
            int(np.sum(written))
        result["discarded_fraction"] = round(lost / max(1, tally.count("rows_in")), 6)
        return result


@with_engine
def stratify(src: str, dst: str, options: StratifyOptions, output: OutputOptions, run: RunSettings = RunSettings(),
             *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """Stratify SRC into DST. Exact mode: a counting pass, one or two threshold passes over the label
    column, then one parallel filtering pass that writes."""
    dataset = open_source(src, dst, output, tmp_dir=options.tmp_dir, format=format, skip_corrupt=skip_corrupt)
    return write_stratified(dataset, resolve(dataset, options, seed, run.threads), dst, output, run, seed=seed)


def write_stratified(dataset: Dataset, strat: Stratification, dst: str, output: OutputOptions, run: RunSettings,
                     *, seed: int, write: Callable[..., JobResult] = write_job, who: str = "stratify") -> JobResult:
    """The pass that writes (`write` is write_job, or a wrapper when stratify is a pipeline's last stage,
    whose name `who` then labels the progress bars)."""
    report = ReadReport()
    selection = Selection(dataset, strat, seed)
    with labels_counted(dataset, strat, run.threads):
        return _write(selection, selection.items(run.threads, report), dst, output, run, report, write, who)


@contextlib.contextmanager
def labels_counted(dataset: Dataset, strat: Stratification, threads: int) -> Iterator[None]:
    """A bad label found while streaming (no counting pass: --init-probs, --mode online) becomes the error
    over the whole dataset: every bad label counted, the first one named."""
    try:
        yield
    except LabelError:
        raise full_label_error(dataset, strat.options.label, strat.num_classes, threads) from None


def _plan(dataset: Dataset, options: StratifyOptions, counted: stats_mod.DatasetStats | None, num_classes: int,
          target: np.ndarray, seed: int, threads: int, info: dict[str, Any]) -> tuple[Plan, float | None]:
    """The plan of the exact and Bernoulli modes, and the expected output rows (None if unknown)."""
    if counted is None:
        init = np.asarray(options.init_probs, dtype=np.float64)
        check_zero_classes(init, target, "--init-probs")
        accept = acceptance_probs(init, target)
        info.update(input_probs=init.tolist(), acceptance_probs=accept.tolist())
        return RatePlan(tuple(accept.tolist())), None
    counts = np.array([counted.label_counts.get(i, 0) for i in range(num_classes)], dtype=np.int64)  # 1 == 1.0
    init = counts / max(1, counts.sum())
    check_zero_classes(init, target, "counted in SRC")
    info["input_probs"] = init.tolist()
    if options.mode == "exact":
        totals, m = exact_totals(counts, target, options)
        info.update(total_m=m.numerator if m.denominator == 1 else round(float(m), 6),
                    class_targets={str(i): int(t) for i, t in enumerate(totals.tolist())})
        plan = threshold_plan(totals, counts, lambda ranks: find_thresholds(
            dataset, options.label, num_classes, ranks, counts, seed, threads))
        return plan, float(totals.sum())
    rates = replacement_rates(counts, target, options) if options.replacement else acceptance_probs(init, target)
    info["rates" if options.replacement else "acceptance_probs"] = rates.tolist()
    return RatePlan(tuple(rates.tolist())), float((counts * rates).sum())


def _write(job: Selection, items: Iterable[tuple[Callable[[], Chunk], Plan]], dst: str, output: OutputOptions,
           run: RunSettings, report: ReadReport, write: Callable[..., JobResult], who: str) -> JobResult:
    """Write the selection: one row group per input chunk, batches of --batch-size, or balanced batches."""
    options, dataset, strat = job.options, job.dataset, job.strat
    expected_rows = strat.expected_rows
    common = dict(command="stratify", options=manifest_options(options, output), seed=job.seed, dataset=dataset,
                  dst=dst, output=output, schema=dataset.schema, run=run, report=report)
    if options.batch_size is None:
        return write(**common, items=job.pieces(items, run.threads), work=job.build_batch, stats=job.stats,
                     total_rows=dataset.progress_rows)
    selected = (c for c, _ in ordered_map(job.build, job.pieces(items, run.threads), run.threads) if c.num_rows)
    first, selected = peek(selected)
    most_rows = int(expected_rows) if options.mode == "exact" else None if options.replacement else dataset.num_rows
    budget.check_rows("--batch-size", options.batch_size, most_rows, bytes_per_row(first), options.memory)
    if not options.balanced_batches:
        batches = rebatch(selected, options.batch_size, dataset.schema, options.drop_remainder)
        return write(**common, items=job.counted(batches), work=emit, stats=job.stats,
                     total_rows=int(expected_rows) if expected_rows is not None else None)
    active = strat.target > 0
    whole = estimate_memory_bytes(dataset, first, rows=int(expected_rows) if expected_rows is not None else None)
    part_bytes = max(1, options.memory // (PART_SHARE * int(active.sum())))
    parts = [parts_for(whole * t, part_bytes) for t in strat.target.tolist()]
    with keyed_spill(dataset.schema, parts, job.seed, STAGE + "/order", options.memory, options.tmp_dir) as spill:
        spill_streams(selected, spill, lambda c: label_codes(c, options.label, job.num_classes, dataset.locate),
                      f"{who}: select", dataset.progress_rows, run.quiet)
        available = spill.rows.copy()
        layout = plan_layout(available, strat.target, options.batch_size, partial=not options.drop_remainder,
                             oversample=False)
        streams = [RowReader(spill.read_group(c), dataset.schema) for c in range(job.num_classes)]
        extra = {"batch_size": options.batch_size, "balanced_batches": layout.batches + bool(sum(layout.partial)),
                 "final_batch_quotas": list(layout.partial)}
        return write(**common, items=job.counted(balanced_batches(streams, layout, job.seed, dataset.schema)),
                     work=emit, stats=lambda: job.stats(extra), total_rows=int(layout.per_class.sum()))


def _by_class(counts: np.ndarray) -> dict[str, int]:
    return {str(i): int(n) for i, n in enumerate(np.asarray(counts).tolist())}


def discard_warning(stats: dict[str, Any]) -> str | None:
    """One line for stderr when more than half of the examples never reach DST (`stratified_sample` logs this too)."""
    fraction = stats.get("discarded_fraction", 0.0)
    if fraction <= 0.5:
        return None
    hint = "a larger --size keeps more" if stats.get("replacement") else "--replacement upsamples instead"
    return (f"warning: stratify discarded {fraction:.1%} of the examples ({stats['examples_dropped']:,} of "
            f"{stats['rows_in']:,} never appear in DST); {hint}")


__all__ = ["RatePlan", "Selection", "Stratification", "StratifyOptions", "ThresholdPlan",
           "acceptance_probs", "discard_warning", "find_thresholds", "label_codes",
           "largest_total", "parse_target", "resolve", "stratify", "write_stratified"]
