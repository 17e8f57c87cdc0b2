"""`stratify`: resample to target class proportions (exact, Bernoulli, online, with replacement, balanced batches)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import rng
from batchtool import stats as stats_mod
from batchtool.dataset import Chunk
from batchtool.errors import InputError
from batchtool.ops.base import (Choice, Column, Context, Depends, Flag, Integer, Operation, OptionError, Tally, Value,
                                flag, need_columns, option)
from batchtool.ops.base import shown as shown_value
from batchtool.ops.labels import MAX_CLASSES, Locate, LabelError, bad_label_count, full_label_error, label_codes
from batchtool.ops.quotas import QuotaLayout
from batchtool.ops.resample import Copies, Piece, copy_stats, copy_summary
from batchtool.ops.keyed import DEFAULT_MEMORY
from batchtool.ops.rows import RowReader
from batchtool.ops.stratify_plans import (STAGE, Plan, RatePlan, Target, ThresholdPlan, acceptance_probs,
                                          check_zero_classes, exact_target, exact_totals, largest_total,
                                          replacement_rates, target_vector, threshold_plan)
from batchtool.ops.thresholds import find_thresholds

MODES = ("exact", "bernoulli", "online")
PROB_TOLERANCE = 1e-6
"""How far from 1 a list of probabilities may sum (`tf.contrib.training.stratified_sample`'s tolerance)."""
ONLINE_PRIOR = 10
"""Pseudo-count of every class before any label is seen (`stratified_sample_unknown_dist`'s smoothing constant)."""


# -- options ---------------------------------------------------------------------------------------------------


def field_of(flag: str) -> str:
    """--init-probs -> init_probs (the callers outside the schema name a flag)."""
    return flag.lstrip("-").replace("-", "_")


def parse_probs(text: str, flag: str) -> tuple[float, ...]:
    """'0.5,0.3,0.2' -> (0.5, 0.3, 0.2)."""
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise OptionError(field_of(flag), "expected comma-separated probabilities, e.g. 0.5,0.3,0.2",
                          value=repr(text)) from None


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
            raise OptionError("target", f"{item!r} is not a new CLASS=PROB pair with CLASS an integer >= 0",
                              value=repr(text))
        pairs[cls] = prob
    return pairs


def check_probs(values: Iterable[float], flag: str) -> None:
    """`stratified_sample`'s checks: probabilities >= 0 that sum to one within PROB_TOLERANCE."""
    values, name = list(values), field_of(flag)
    shown = ",".join(f"{v:g}" for v in values)
    if not values:
        raise OptionError(name, "no probabilities given")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise OptionError(name, f"probabilities must be >= 0 (value {i} is {v:g})", value=shown)
    total = math.fsum(values)
    if abs(total - 1.0) > PROB_TOLERANCE:
        raise OptionError(name, f"probabilities sum to {total:.9g}, expected 1 (tolerance {PROB_TOLERANCE:g})",
                          value=shown)


def _probs_text(field: str, value: Any) -> str:
    """A pipeline file's probabilities as the command line's text: a list of numbers, or a string."""
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise OptionError(field, f"expected a list of probabilities or a string, got {shown_value(value)}")
    return value


class TargetSpec(Value):
    """--target: 'uniform', P0,P1,... or CLASS=PROB pairs; in a pipeline file also a list or a table."""

    metavar = "SPEC"

    def parse(self, field: str, value: Any) -> Target:
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        return parse_target(_probs_text(field, value))


class Probs(Value):
    """P0,P1,...: class proportions (a list of numbers in a pipeline file)."""

    metavar = "P0,P1,..."

    def parse(self, field: str, value: Any) -> tuple[float, ...]:
        return parse_probs(_probs_text(field, value), flag(field))


@dataclass(frozen=True)
class StratifyOptions:
    """What `stratify` computes; `memory` and `tmp_dir` only bound the balanced-batch spill."""

    label: str = option("Integer class column (values in [0, classes)).", Column(), "label")
    target: Target = option("Target proportions: P0,P1,... or 'uniform' or CLASS=PROB pairs (others get 0).",
                            TargetSpec(), "uniform", required=True)
    mode: str = option("exact: floor(M*t_i) examples per class, M = min_i n_i/t_i (n_i: examples); bernoulli: "
                       "per-example acceptance as tf.contrib.training.stratified_sample; "
                       "online: class distribution estimated as the data streams.", Choice(MODES), "exact")
    init_probs: tuple[float, ...] | None = option(
        "Known class proportions of SRC (--mode bernoulli; default: counted in a first pass).", Probs(), None)
    num_classes: int | None = option("Number of classes (default: from --target, or the largest label + 1).",
                                     Integer(), None)
    replacement: bool = option("Upsample small classes instead of discarding large ones.", Flag(), False)
    size: int | None = option("Output examples (--replacement: default the input size; exact: at most M).",
                              Integer(), None)
    batch_size: int | None = option("Write batches (row groups) of this many rows.", Integer(), None)
    drop_remainder: bool = option("Drop the final batch if it is smaller than --batch-size.", Flag(), False)
    balanced_batches: bool = option("Every batch holds its exact share of each class, rows shuffled, batches in "
                                    "random order.", Flag(), False)
    memory: int = DEFAULT_MEMORY
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError("mode", f"expected one of {', '.join(MODES)}", value=repr(self.mode))
        if isinstance(self.target, str) and self.target != "uniform":
            raise OptionError("target", "expected 'uniform', P0,P1,... or CLASS=PROB pairs", value=repr(self.target))
        if not isinstance(self.target, str):
            check_probs(self.target.values() if isinstance(self.target, dict) else self.target, "--target")
        if self.init_probs is not None:
            if self.mode != "bernoulli":
                raise OptionError("init_probs", f"{{init_probs}} applies to {{mode}} bernoulli ({{mode}} {self.mode} "
                                  + ("counts the classes first)" if self.mode == "exact" else "estimates them)"),
                                  mentions=["mode"])
            check_probs(self.init_probs, "--init-probs")
        if self.num_classes is not None and self.num_classes < 1:
            raise OptionError("num_classes", "must be at least 1", value=str(self.num_classes))
        self._check_class_counts()
        if self.replacement and self.mode == "online":
            raise OptionError("replacement", "{replacement} needs the class counts: use {mode} exact or bernoulli",
                              mentions=["mode"])
        if self.mode == "online":
            self.known_classes()
        if self.replacement and self.init_probs is not None:
            raise OptionError("init_probs", "{replacement} counts the classes itself; drop {init_probs}",
                              mentions=["replacement"])
        if self.size is not None and (self.size < 1 or (self.mode != "exact" and not self.replacement)):
            raise OptionError("size", "must be >= 1, with {mode} exact or {replacement}", value=str(self.size),
                              mentions=["mode", "replacement"])
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError("batch_size", "must be at least 1", value=str(self.batch_size))
        if (self.balanced_batches or self.drop_remainder) and self.batch_size is None:
            name = "balanced_batches" if self.balanced_batches else "drop_remainder"
            raise OptionError(name, f"{{{name}}} needs {{batch_size}}", mentions=["batch_size"])
        if self.memory <= 0:
            raise OptionError("memory", "must be a positive size", value=str(self.memory))

    def _check_class_counts(self) -> None:
        """--target list, --num-classes and --init-probs must agree on the number of classes, at most MAX_CLASSES."""
        named = max(self.target) + 1 if isinstance(self.target, dict) and self.target else 0
        for name, n in (("num_classes", self.num_classes or 0), ("target", named)):
            if n > MAX_CLASSES:
                raise OptionError(name, f"{n:,} classes; at most {MAX_CLASSES:,} (every chunk counts its labels "
                                  "per class)")
        sizes = {name: n for name, n in (
            ("target", len(self.target) if isinstance(self.target, tuple) else None),
            ("num_classes", self.num_classes),
            ("init_probs", len(self.init_probs) if self.init_probs is not None else None)) if n is not None}
        if len(set(sizes.values())) > 1:
            raise OptionError(next(iter(sizes)), "the number of classes disagrees: "
                              + ", ".join(f"{{{name}}} gives {n}" for name, n in sizes.items()), mentions=list(sizes))
        if isinstance(self.target, dict) and sizes and max(self.target) >= min(sizes.values()):
            raise OptionError("target", f"{{target}} names class {max(self.target)} but there are only "
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
            raise OptionError("target", "{target} uniform with {mode} online needs {num_classes} "
                              "(there is no counting pass to find the classes)", mentions=["mode", "num_classes"])
        return None

    @property
    def needs_counts(self) -> bool:
        return self.mode == "exact" or (self.mode == "bernoulli" and self.init_probs is None)



def classes_from_data(counted: stats_mod.DatasetStats, options: StratifyOptions) -> int:
    """Uniform and class=prob targets without --num-classes: classes 0..(largest label seen)."""
    seen = [int(v) for v in counted.label_counts if isinstance(v, (int, float)) and float(v).is_integer() and v >= 0]
    largest = max(seen + ([max(options.target)] if isinstance(options.target, dict) else []), default=0)
    if largest >= MAX_CLASSES:
        raise InputError(f"column {options.label!r}: labels go up to {largest}; pass --num-classes or a "
                         "--target list if there really are that many classes")
    return largest + 1



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
    seed: int
    locate: Locate
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


def _plan(context: Context, options: StratifyOptions, counted: stats_mod.DatasetStats | None, num_classes: int,
          target: np.ndarray, info: dict[str, Any]) -> tuple[Plan, float | None]:
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
            context.scan, options.label, num_classes, ranks, counts, context.seed, context.locate))
        return plan, float(totals.sum())
    rates = replacement_rates(counts, target, options) if options.replacement else acceptance_probs(init, target)
    info["rates" if options.replacement else "acceptance_probs"] = rates.tolist()
    return RatePlan(tuple(rates.tolist())), float((counts * rates).sum())


def _by_class(counts: np.ndarray) -> dict[str, int]:
    return {str(i): int(n) for i, n in enumerate(np.asarray(counts).tolist())}


class Stratify(Operation[StratifyOptions, Stratification]):
    """stratify's definition: options, first pass, plan, kernel, report and dry run. Its writer (batches of
    --batch-size, balanced batches spilled by class) and its pipeline stage are still its own
    (batchtool.stratify_writer, pipeline/stages.StratifyStage), so it is not yet in OPERATIONS."""

    name = "stratify"
    summary = "Resample SRC to target class proportions (tf.contrib.training.stratified_sample) and write DST."
    example = "batchtool stratify sample_data/parquet /tmp/balanced --label label --target uniform"
    options = StratifyOptions
    seeded = True
    spills = True
    expands = True
    batches_flag = "--balanced-batches"

    def needs(self, options: StratifyOptions) -> list[str]:
        return [options.label]

    def depends(self, options: StratifyOptions) -> Depends:
        return Depends.CHUNKS if options.mode == "online" else Depends.ORDER

    def output_schema(self, options: StratifyOptions, schema: pa.Schema) -> pa.Schema:
        need_columns(schema, "label", [options.label])
        return schema

    def first_pass_columns(self, options: StratifyOptions) -> list[str]:
        """The class counts (unless --init-probs or --mode online make them unnecessary)."""
        return [options.label] if options.needs_counts else []

    def first_pass(self, options: StratifyOptions, context: Context, chunk: Chunk) -> Tally:
        part = stats_mod.chunk_stats(chunk, options.label, None)
        return Tally.of(label_counts=Counter(part.label_counts), label_nulls=part.label_nulls)

    def plan(self, options: StratifyOptions, context: Context, stats: Tally | None) -> Stratification:
        """The classes, the target and, unless --mode online (which plans chunk by chunk), the plan: in exact
        mode with the per-class thresholds, found in further passes over the label column."""
        num_classes = options.known_classes()
        counted = None
        if stats is not None:
            counted = stats_mod.DatasetStats(label_counts=dict(stats.counts.get("label_counts", {})),
                                             label_nulls=stats.count("label_nulls"))
            num_classes = num_classes or classes_from_data(counted, options)
            if bad_label_count(counted, num_classes):
                raise full_label_error(context.scan, options.label, num_classes, context.locate, counted)
        target = target_vector(options.target, num_classes)
        info: dict[str, Any] = {"label": options.label, "mode": options.mode, "replacement": options.replacement,
                                "num_classes": num_classes, "target": target.tolist()}
        plan: Plan | None = None
        expected_rows: float | None = None
        if options.mode != "online":
            plan, expected_rows = _plan(context, options, counted, num_classes, target, info)
        return Stratification(options, num_classes, target, plan, expected_rows, info, context.seed, context.locate)

    def per_chunk(self, plan: Stratification) -> Callable[[Chunk], Stratification] | None:
        """--mode online: chunk c's acceptance probabilities come from the label counts of chunks 0..c in input
        order (plus ONLINE_PRIOR per class), so they do not depend on threads."""
        if plan.plan is not None:
            return None
        seen = np.full(plan.num_classes, float(ONLINE_PRIOR))

        def chunk_plan(chunk: Chunk) -> Stratification:
            nonlocal seen
            seen = seen + np.bincount(plan.labels(chunk), minlength=plan.num_classes)
            rates = RatePlan(tuple(acceptance_probs(seen / seen.sum(), plan.target).tolist()))
            return replace(plan, plan=rates, seen=seen)
        return chunk_plan

    def kernel(self, plan: Stratification, chunk: Chunk) -> tuple[Copies, Tally]:
        """One chunk's copies per row (built into rows piece by piece) and its class counts before and after."""
        labels = plan.labels(chunk)
        copies = plan.plan.copies(labels, chunk.ids, plan.seed)  # type: ignore[union-attr]
        tally = copy_stats(copies)
        k = plan.num_classes
        tally.add(class_in=np.bincount(labels, minlength=k),
                  class_selected=np.bincount(labels, weights=copies, minlength=k).astype(np.int64))
        if plan.seen is not None:
            tally.latest["online_final_probs"] = (plan.seen / plan.seen.sum()).tolist()
        return Copies(chunk, copies), tally

    def pieces(self, output: Copies) -> Iterator[Piece]:
        return output.pieces()

    def build(self, plan: Stratification, piece: Piece) -> tuple[Chunk, int]:
        """One piece's output rows (copies consecutive) and the input rows it completes."""
        return piece.build(plan.seed, STAGE), piece.rows

    def report(self, plan: Stratification, stats: Tally) -> dict[str, Any]:
        """manifest["stats"]: the plan, class counts before and after, copies and what was discarded (the
        writer adds `class_out`, the classes of the batches it wrote, and `latest["batches"]`, their layout)."""
        zeros = np.zeros(plan.num_classes)
        written = stats.counts.get("class_out", stats.counts.get("class_selected", zeros))
        online = {k: v for k, v in stats.latest.items() if k == "online_final_probs"}
        result = {**plan.info, **online, **copy_summary(stats),
                  "class_counts_before": _by_class(stats.counts.get("class_in", zeros)),
                  "class_counts_after": _by_class(written), **stats.latest.get("batches", {})}
        lost = stats.count("examples_dropped") + int(np.sum(stats.counts.get("class_selected", 0))) - \
            int(np.sum(written))
        result["discarded_fraction"] = round(lost / max(1, stats.count("rows_in")), 6)
        return result

    def expected(self, plan: Stratification, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        return plan.expected()


OP = Stratify()


def discard_warning(stats: dict[str, Any]) -> str | None:
    """One line for stderr when more than half of the examples never reach DST (`stratified_sample` logs this too)."""
    fraction = stats.get("discarded_fraction", 0.0)
    if fraction <= 0.5:
        return None
    hint = "a larger --size keeps more" if stats.get("replacement") else "--replacement upsamples instead"
    return (f"warning: stratify discarded {fraction:.1%} of the examples ({stats['examples_dropped']:,} of "
            f"{stats['rows_in']:,} never appear in DST); {hint}")


__all__ = ["MAX_CLASSES", "MODES", "OP", "ONLINE_PRIOR", "STAGE", "LabelError", "RatePlan", "Stratification",
           "Stratify", "StratifyOptions", "Target", "ThresholdPlan", "acceptance_probs", "balanced_batches",
           "check_probs", "check_zero_classes", "discard_warning", "exact_target", "exact_totals", "find_thresholds",
           "label_codes", "largest_total", "parse_probs", "parse_target", "target_vector", "threshold_plan"]
