"""The `stratify` op's run: its Operation (its declaration, DECLARED, is the package's)."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core.errors import OptionInputError
from batchtool.core.tally import Tally
from batchtool.io import stats as stats_mod
from batchtool.io.dataset import Chunk
from batchtool.ops.base import Context, Depends, Kind, Operation, Pass, Said, Shape, need_columns, who
from batchtool.ops.copies import Copies, copy_stats, copy_summary
from batchtool.ops.labels import (LabelError, MAX_CLASSES, bad_label_count, check_label_type, full_label_error,
                                  is_class, label_codes)
from batchtool.ops.regroup import Exchange, Input, Probe, Stream
from batchtool.ops.stratify import DECLARED
from batchtool.ops.stratify.batches import batched, exchange
from batchtool.ops.stratify.options import MODES, StratifyOptions
from batchtool.ops.stratify.plans import (Plan, RatePlan, STAGE, Stratification, acceptance_probs, exact_totals,
                                          replacement_rates, threshold_plan)
from batchtool.ops.stratify.thresholds import find_thresholds
from batchtool.ops.targets import check_zero_classes, target_vector

ONLINE_PRIOR = 10
"""Pseudo-count of every class before any label is seen (`stratified_sample_unknown_dist`'s smoothing constant)."""


NOT_A_CLASS = -1
"""The key under which the first pass counts every label that is no class (null aside): so the counts hold at most
one entry per class, however many distinct values a label column holds."""


def classes_from_data(counted: stats_mod.DatasetStats, options: StratifyOptions, largest_seen: float) -> int:
    """Uniform and class=prob targets without --num-classes: classes 0..(largest label seen)."""
    seen = [int(v) for v in counted.label_counts if v != NOT_A_CLASS] + (
        [int(largest_seen)] if largest_seen >= MAX_CLASSES else [])
    largest = max(seen + ([max(options.target)] if isinstance(options.target, dict) else []), default=0)
    if largest >= MAX_CLASSES:
        raise OptionInputError("num_classes", f"labels go up to {largest}; pass {{num_classes}} or a {{target}} list "
                               "if there really are that many classes", mentions=("target",),
                               where=f"column {options.label!r}: ")
    return largest + 1


def _plan(context: Context, options: StratifyOptions, counted: stats_mod.DatasetStats | None, num_classes: int,
          target: np.ndarray, info: dict[str, Any]) -> tuple[Plan, float | None]:
    """The plan of the exact and Bernoulli modes, and the expected output rows (None if unknown)."""
    if counted is None:
        init = np.asarray(options.init_probs, dtype=np.float64)
        check_zero_classes(init, target)
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


def _class_counts(options: StratifyOptions, context: Context, chunk: Chunk) -> Tally:
    """The first pass's statistics of a chunk: its rows per class; labels that can be no class (fractional,
    negative, past --num-classes or the most classes) are counted together, with the largest of them, so the
    counts never outgrow the classes."""
    check_label_type(context, options.label)  # before a first chunk's labels are counted
    part = stats_mod.chunk_stats(chunk, options.label, None)
    classes = options.known_classes() or MAX_CLASSES
    counts: Counter[int] = Counter()
    for value, n in part.label_counts.items():
        counts[int(value) if is_class(value, classes) else NOT_A_CLASS] += n
    tally = Tally.of(label_counts=counts, label_nulls=part.label_nulls)
    finite = [v for v in part.label_counts if math.isfinite(v)]
    tally.add_values("label", np.array([max(finite, default=0)], dtype=np.float64))
    return tally


class Stratify(Operation[StratifyOptions, "Stratification"], declared=DECLARED):
    """stratify's definition: options, first pass, plan, kernel, report and dry run; with --batch-size it
    regroups its selection into batches (ops/stratify/batches.py)."""

    def input_columns(self, options: StratifyOptions, columns: list[str] | None) -> list[str] | None:
        return None if columns is None else list(dict.fromkeys([*columns, options.label]))

    def output_schema(self, options: StratifyOptions, schema: pa.Schema) -> pa.Schema:
        need_columns(schema, "label", [options.label])
        return schema

    def first_pass(self, options: StratifyOptions, schema: pa.Schema) -> Pass | None:
        """The class counts (unless --init-probs or --mode online make them unnecessary); in exact mode its
        thresholds are keyed hashes of the ids, so a shuffle before it must really run."""
        if not options.needs_counts:
            return None
        return Pass([options.label], Tally, functools.partial(_class_counts, options),
                    depends=Depends.ORDER if options.mode == "exact" else Depends.ROWS)

    def plan(self, options: StratifyOptions, context: Context, stats: Tally | None) -> Stratification:
        """The classes, the target and, unless --mode online (which plans chunk by chunk), the plan: in exact
        mode with the per-class thresholds, found in further passes over the label column."""
        check_label_type(context, options.label)
        num_classes = options.known_classes()
        counted = None
        if stats is not None:
            counted = stats_mod.DatasetStats(label_counts=dict(stats.counts.get("label_counts", {})),
                                             label_nulls=stats.count("label_nulls"))
            num_classes = num_classes or classes_from_data(counted, options, stats.high.get("label", 0.0))
            if bad_label_count(counted, num_classes):
                raise full_label_error(context.scan, options.label, num_classes, context.locate, counted)
        target = target_vector(options.target, num_classes)
        info: dict[str, Any] = {"label": options.label, "mode": options.mode, "replacement": options.replacement,
                                "num_classes": num_classes, "target": target.tolist()}
        plan: Plan | None = None
        expected_rows: float | None = None
        if options.mode != "online":
            plan, expected_rows = _plan(context, options, counted, num_classes, target, info)
        return Stratification(options, num_classes, target, plan, expected_rows, info, context.seed, context.locate,
                              context.memory, context.tasks)

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
        return Copies(chunk, copies, plan.seed, STAGE), tally

    def regroup(self, plan: Stratification, input: Input, probe: Probe) -> Exchange | Stream:
        """--balanced-batches: the exchange of its selection; plain batches of it as it streams."""
        if plan.options.balanced_batches:
            return exchange(self, plan, input, probe)
        return Stream(functools.partial(batched, self, plan, input))

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

    def said(self, stats: dict[str, Any]) -> Said:
        """A warning when more than half of the examples never reach DST (`stratified_sample` logs this too)."""
        hint = "a larger --size keeps more" if stats.get("replacement") else "--replacement upsamples instead"
        return Said(discard_warning(stats, self.name, hint))

    def expected(self, plan: Stratification, rows_in: int | None, stats: Any = None) -> tuple[int | None, dict[str, Any]]:
        return plan.expected()


def discard_warning(stats: dict[str, Any], name: str, hint: str) -> tuple[str, ...]:
    """The warning of an op that selects (stratify, mix) when more than half of its input never reaches DST (its
    `discarded_fraction`), with `hint`, how to keep more; none otherwise."""
    fraction = stats.get("discarded_fraction", 0.0)
    if fraction <= 0.5:
        return ()
    return (f"warning: {who(stats, name)} discarded {fraction:.1%} of the examples "
            f"({stats['examples_dropped']:,} of {stats['rows_in']:,} never appear in DST); {hint}",)


OP = Stratify()

__all__ = ["MAX_CLASSES", "MODES", "OP", "ONLINE_PRIOR", "LabelError", "Stratify", "StratifyOptions",
           "discard_warning", "label_codes"]
