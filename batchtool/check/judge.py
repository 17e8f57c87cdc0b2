"""`check`'s verdicts: each rule's PASS or FAIL from what the one pass measured, or from metadata (the schema,
the manifest's padding stats, the batches) for the rules that need no pass."""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import singledispatch

import pyarrow as pa

from batchtool.io.formats import registry
from batchtool.check.batches import BATCH_RULES, judge_batches
from batchtool.check.drift import Baseline, judge_drift, profile_of
from batchtool.check.report import Offender, RuleResult, every, plural, verdict
from batchtool.check.rules import (ClassProportions, Crc, Drift, LabelRange, Length, MinClassRows, NoDuplicateRows,
                                   NoNan, NoNulls, PaddingEfficiency, RankCost, RowCount, Rule, SameLength, Schema,
                                   Unique)
from batchtool.check.scan import Measures
from batchtool.check.recorded import recorded_stat
from batchtool.io.dataset import Dataset
from batchtool.core.errors import UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor


def judge_metadata(rules: Sequence[Rule], dataset: Dataset, limit: int, threads: int) -> Iterator[RuleResult]:
    """The results of the rules answered without the pass, in order: the schema, padding efficiency from the
    manifest, batch rules; UsageError for a CRC rule on a format without CRCs."""
    for rule in rules:
        if isinstance(rule, Schema):
            yield judge_schema(rule, dataset.schema)
        elif isinstance(rule, PaddingEfficiency) and not rule.per_bucket:
            yield judge_padding(rule, dataset)
        elif isinstance(rule, RankCost):
            yield judge_rank_cost(rule, dataset)
        elif isinstance(rule, (PaddingEfficiency, *BATCH_RULES)):
            yield judge_batches(rule, dataset, limit, threads)
        elif isinstance(rule, Crc) and not dataset.spec.record_checksums:
            having = registry.checksummed()
            raise UsageError(f"{rule.label}: {dataset.src} is {dataset.format}; "
                             f"CRCs exist only in {having} files")


def judge_measured(rules: Sequence[Rule], m: Measures, baseline: Baseline | None, run: RunSettings,
                   executor: Executor, limit: int) -> Iterator[RuleResult]:
    """The results of the rules the pass measured, in order; drift rules against the baseline's profile."""
    drift = [r for r in rules if isinstance(r, Drift)]
    profiles = (profile_of(m, drift), baseline.profile(drift, run, executor)) if drift else ()
    for rule in rules:
        yield judge_drift(rule, *profiles, limit) if isinstance(rule, Drift) else judge(rule, m)


@singledispatch
def judge(rule: Rule, m: Measures) -> RuleResult:
    """One measured rule's result: a function registered per rule class below."""
    raise NotImplementedError(type(rule).__name__)


def _type_text(text: str) -> str:
    """An Arrow type string compared loosely: no list field names, aliases (float32 -> float) resolved."""
    text = re.sub(r"\b(?:element|item): ", "", re.sub(r"\s+", " ", text).strip())

    def alias(match: re.Match) -> str:
        try:
            return str(pa.type_for_alias(match.group(0)))
        except (ValueError, KeyError):
            return match.group(0)

    return re.sub(r"[a-z][a-z0-9_]*", alias, text)


def judge_schema(rule: Schema, schema: pa.Schema) -> RuleResult:
    """Each listed column present with its type (compared loosely), and with `exact` no other column."""
    actual = {f.name: f.type for f in schema}
    problems = []
    for column, want in rule.columns:
        if column not in actual:
            problems.append(f"column {column!r} missing")
        elif _type_text(str(actual[column])) != _type_text(want):
            problems.append(f"column {column!r} is {actual[column]}, expected {want}")
    if rule.exact:
        wanted = dict(rule.columns)
        problems += [f"unexpected column {c!r}" for c in actual if c not in wanted]
    bound = ", ".join(f"{c}: {t}" for c, t in rule.columns) + (" (no others)" if rule.exact else "")
    measured = (f"{every(len(rule.columns), 'column')} as expected" if not problems
                else "; ".join(problems[:2]) + (f"; {len(problems) - 2} more" if len(problems) > 2 else ""))
    return verdict(rule, not problems, measured, bound, len(problems), len(problems),
                   [Offender(p) for p in problems])


def judge_padding(rule: PaddingEfficiency, dataset: Dataset) -> RuleResult:
    """A padding (or, for PackingEfficiency, packing) efficiency from SRC's manifest, against `min`."""
    recorded, value, at = recorded_stat(rule.label, dataset, rule.stat, rule.written_by)
    value = recorded.share_at(value, at)
    return verdict(rule, value >= rule.min, f"{value:.4f}", f">= {rule.min:g}", value)


def judge_rank_cost(rule: RankCost, dataset: Dataset) -> RuleResult:
    """The worst step's max/mean rank cost from SRC's manifest (`pack --world-size`), against `max`."""
    recorded, value, at = recorded_stat(rule.label, dataset, rule.stat, rule.written_by)
    worst = value.get("worst") if isinstance(value, Mapping) else None
    if not isinstance(worst, (int, float)) or isinstance(worst, bool) or not (math.isfinite(worst) and worst >= 1):
        raise recorded.wrong(at, value, 'an object {"worst": X, "mean": Y} with X a number >= 1')
    mean = value.get("mean")
    shown = f"worst step {worst:.4f}" + (f", mean {mean:.4f}" if isinstance(mean, (int, float)) else "")
    return verdict(rule, worst <= rule.max, shown, f"<= {rule.max:g}", worst)


@judge.register
def _(rule: NoNulls, m: Measures) -> RuleResult:
    counts = {c: m.stats[0].null_counts[c] for c in rule.columns}
    return _count_result(rule, m, counts, "null")


@judge.register
def _(rule: NoNan, m: Measures) -> RuleResult:
    counts = {c: m.stats[0].nan_counts[c] for c in rule.columns}
    return _count_result(rule, m, counts, "NaN")


def _count_result(rule: Rule, m: Measures, counts: dict[str, int], what: str) -> RuleResult:
    total = sum(counts.values())
    measured = f"no {what}s" if not total else f"{plural(total, what)} (" + ", ".join(
        f"{c}: {n:,}" for c, n in counts.items() if n) + ")"
    rows, offenders = m.rule_offenses(rule)
    return verdict(rule, not total, measured, f"0 {what}s in " + ", ".join(rule.columns), total, rows, offenders)


@judge.register
def _(rule: LabelRange, m: Measures) -> RuleResult:
    st = m.label_stats(rule.column)
    outside = {k: v for k, v in sorted(st.label_counts.items()) if not 0 <= k < rule.num_classes}
    total = sum(outside.values()) + st.label_nulls
    parts = [f"label {k}: {v:,}" for k, v in outside.items()] + ([f"null: {st.label_nulls:,}"] if st.label_nulls else [])
    measured = (f"all labels in [0, {rule.num_classes})" if not total
                else f"{plural(total, 'row')} outside [0, {rule.num_classes}) (" + ", ".join(parts[:4])
                + (", ..." if len(parts) > 4 else "") + ")")
    rows, offenders = m.rule_offenses(rule)
    return verdict(rule, not total, measured, f"{rule.column} in [0, {rule.num_classes})", total, rows, offenders)


@judge.register
def _(rule: ClassProportions, m: Measures) -> RuleResult:
    """In time and memory of the classes seen, the target's list or pairs and the offenders listed, however many
    classes 'uniform' spans (num_classes, or the largest label seen)."""
    counts = m.label_stats(rule.column).label_counts
    n = sum(counts.values())
    bound = f"|p - target| <= {rule.tolerance:g}" + (" x target" if rule.relative else "")
    if not n:
        return verdict(rule, False, "no labels", bound, None)
    share, targeted = _target_shares(rule, counts)

    def deviation(k: int) -> float:
        return _deviation(counts.get(k, 0) / n, share(k), rule.relative)

    # A class of the target without labels deviates by its whole share.
    if isinstance(targeted, range):  # 'uniform': they all deviate alike; the last one stands for them
        last = next((k for k in reversed(targeted) if k not in counts), None)
        unseen = [] if last is None else [last]
        offend = last is not None and deviation(last) > rule.tolerance
        offending_unseen: Iterable[int] = (k for k in targeted if k not in counts) if offend else ()
        unseen_offending = len(targeted) - sum(1 for k in counts if k in targeted) if offend else 0
    else:
        unseen = [k for k in targeted if k not in counts]
        offending_unseen = [k for k in unseen if deviation(k) > rule.tolerance]
        unseen_offending = len(offending_unseen)
    seen = sorted(counts)
    dev, k = max((deviation(k), k) for k in [*seen, *unseen])
    offending_seen = [k for k in seen if deviation(k) > rule.tolerance]
    listed = itertools.islice(heapq.merge(offending_seen, offending_unseen), m.plan.limit)
    offenders = [Offender(f"class {c}: {counts.get(c, 0) / n:.4f} of labels, target {share(c):.4f} (deviation "
                          f"{deviation(c):.4f})") for c in listed]
    measured = f"max deviation {dev:.4f} (class {k}: {counts.get(k, 0) / n:.4f}, target {share(k):.4f})"
    return verdict(rule, dev <= rule.tolerance, measured, bound, round(dev, 6) if math.isfinite(dev) else None,
                   len(offending_seen) + unseen_offending, offenders)


def _target_shares(rule: ClassProportions, counts: Mapping[int, int]) -> tuple[Callable[[int], float], Sequence[int]]:
    """Each class's target share (0 outside the target's classes), and the classes given a share, in order: a
    list's or the pairs' own, or for 'uniform' the range [0, num_classes or the largest label seen + 1)."""
    target = rule.target
    if isinstance(target, tuple):
        return (lambda k: target[k] if 0 <= k < len(target) else 0.0), [k for k, t in enumerate(target) if t > 0]
    if isinstance(target, dict):
        return (lambda k: target.get(k, 0.0)), sorted(k for k, t in target.items() if t > 0)
    classes = rule.num_classes or max((k + 1 for k in counts if k >= 0), default=0)
    return (lambda k: 1 / classes if 0 <= k < classes else 0.0), range(classes)


def _deviation(p: float, t: float, relative: bool) -> float:
    """|p - t|, or as a fraction of t (infinite for any share of a class whose target is 0)."""
    if not relative:
        return abs(p - t)
    return abs(p - t) / t if t > 0 else (math.inf if p else 0.0)


@judge.register
def _(rule: MinClassRows, m: Measures) -> RuleResult:
    """In time and memory of the classes seen and the offenders listed, whatever num_classes a rules file gives."""
    counts = m.label_stats(rule.column).label_counts
    n = rule.num_classes
    bound = f">= {plural(rule.min_rows, 'row')} per class" + (f" (classes 0..{n - 1})" if n is not None else "")
    seen = sorted(counts) if n is None else sorted(k for k in counts if 0 <= k < n)
    if not seen and not n:
        return verdict(rule, False, "no labels", bound, 0)
    classes = iter(seen) if n is None else _first_classes(seen, n)
    low = (k for k in classes if counts.get(k, 0) < rule.min_rows)
    listed = list(itertools.islice(low, m.plan.limit))
    enough = sum(1 for k in seen if counts[k] >= rule.min_rows)
    total_low = (len(seen) if n is None else n) - enough
    unseen = None if n is None or len(seen) == n else next(_first_classes(seen, n, unseen_only=True))
    smallest = unseen if unseen is not None else min(seen, key=lambda k: (counts[k], k))
    return verdict(rule, not total_low, f"smallest class {smallest}: {plural(counts.get(smallest, 0), 'row')}", bound,
                   counts.get(smallest, 0), total_low, [Offender(f"class {k}: {plural(counts.get(k, 0), 'row')}")
                                                        for k in listed])


def _first_classes(seen: list[int], n: int, unseen_only: bool = False) -> Iterator[int]:
    """Classes 0, 1, ... below n in order (only those not `seen`, sorted, with `unseen_only`), without holding them."""
    k = 0
    for s in [*seen, n]:
        yield from range(k, s)
        if s < n and not unseen_only:
            yield s
        k = s + 1


@judge.register
def _(rule: Length, m: Measures) -> RuleResult:
    summary = m.length_stats(rule.column).length_summary()
    bounds, value, bad = [], {}, []
    for key, limit, cmp, text in (("min", rule.min, lambda v, b: v >= b, ">="),
                                  ("max", rule.max, lambda v, b: v <= b, "<=")):
        if limit is not None:
            bounds.append(f"{key} {text} {limit}")
            if summary["count"]:
                value[key] = summary[key]
                bad += [] if cmp(summary[key], limit) else [key]
    for key, _ in Length.QUANTILES:
        lo_hi = getattr(rule, key)
        if lo_hi is not None:
            bounds.append(f"{key} in [{lo_hi[0]}, {lo_hi[1]}]")
            value[key] = summary.get(key)
            bad += [] if summary["count"] and lo_hi[0] <= summary[key] <= lo_hi[1] else [key]
    measured = (", ".join(f"{k} {v}" for k, v in value.items()) if summary["count"] else "no rows")
    if bad:
        measured += " (" + ", ".join(bad) + " out of bounds)"
    rows, offenders = m.rule_offenses(rule)
    return verdict(rule, not bad, f"{rule.column}: {measured}", ", ".join(bounds), value, rows, offenders)


@judge.register
def _(rule: SameLength, m: Measures) -> RuleResult:
    rows, offenders = m.rule_offenses(rule)
    measured = "every row agrees" if not rows else f"{plural(rows, 'row')} {'disagrees' if rows == 1 else 'disagree'}"
    return verdict(rule, not rows, measured, "same steps in " + ", ".join(rule.columns), rows, rows, offenders)


@judge.register(Unique)
@judge.register(NoDuplicateRows)
def _(rule: Rule, m: Measures) -> RuleResult:
    count, offenders = m.repeats[rule.columns]
    what = "key" if isinstance(rule, Unique) else "row"
    measured = (f"{every(m.rows, what)} distinct" if not count
                else f"{plural(count, 'row')} {'repeats' if count == 1 else 'repeat'} an earlier {what}")
    cols = ", ".join(rule.columns) if isinstance(rule, Unique) or len(rule.columns) <= 3 else "all columns"
    return verdict(rule, not count, measured, f"0 repeated ({cols})", count, count, offenders)


@judge.register
def _(rule: RowCount, m: Measures) -> RuleResult:
    rows = m.rows
    bound = (f"[{rule.min:,}, {rule.max:,}]" if rule.min is not None and rule.max is not None
             else f">= {rule.min:,}" if rule.min is not None else f"<= {rule.max:,}")
    ok = (rule.min is None or rows >= rule.min) and (rule.max is None or rows <= rule.max)
    return verdict(rule, ok, plural(rows, "row"), bound, rows)


@judge.register
def _(rule: Crc, m: Measures) -> RuleResult:
    n = m.report.corrupt_records
    files = len(m.dataset.shards)
    measured = f"all records valid in {plural(files, 'file')}" if not n else plural(n, "corrupt record")
    return verdict(rule, not n, measured, "0 corrupt records", n, n,
                   [Offender(e) for e in m.report.first_errors[:m.plan.limit]])
