"""Drift rules: SRC's statistics against a baseline's (another dataset, a batchtool output, or its manifest).

Both sides are reduced to a `Profile` (rows, label counts, length quantiles, null counts) from
one pass over only the columns the drift rules name, with the same plan and scan as every
other rule. A baseline manifest answers from its recorded stats when they are enough; else its
data is read, and without data the rules the manifest cannot answer are skipped.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from batchtool.core import fs
from batchtool.check.columns import LABEL, LENGTH, need
from batchtool.check.report import Offender, RuleResult, plural, skipped, verdict
from batchtool.check.rules import Drift, DriftLengths, DriftNulls, DriftProportions, DriftRows, Length, Rule
from batchtool.check.scan import Measures, scan_plan, measure
from batchtool.check.recorded import Recorded
from batchtool.io.dataset import Dataset
from batchtool.io.inputs import open_dataset
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor
from batchtool.io.manifest import manifest_path, output_files, schema_from_json
from batchtool.io.manifest_reader import read_manifest, read_manifest_file
from batchtool.io.stats import default_label, default_length


@dataclass(frozen=True)
class Profile:
    """What the drift rules compare, of one dataset; a statistic it lacks (a manifest's) is absent, not zero."""

    src: str
    rows: int
    classes: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    """Rows per label value, per label column (nulls not counted)."""
    quantiles: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """p50, p90, p99 of each length column."""
    nulls: Mapping[str, int] = field(default_factory=dict)


def profile_of(m: Measures, rules: Sequence[Drift]) -> Profile:
    """The profile of a dataset the scan measured with these (resolved) drift rules in its plan."""
    classes = {r.column: m.label_stats(r.column).label_counts for r in rules if isinstance(r, DriftProportions)}
    quantiles = {r.column: {k: m.length_stats(r.column).length_quantile(q) for k, q in Length.QUANTILES}
                 for r in rules if isinstance(r, DriftLengths)}
    nulls = {c: m.stats[0].null_counts[c] for r in rules if isinstance(r, DriftNulls) for c in r.columns}
    return Profile(m.dataset.src, m.rows, classes, quantiles, nulls)


@dataclass(frozen=True)
class Baseline:
    """What --baseline names: a dataset, a manifest, or both (a batchtool output); the data is opened only when
    the manifest's stats do not answer the rules."""

    src: str
    schema: pa.Schema
    manifest: dict | None
    data: str | None
    """Where the baseline's data files are (None: a manifest alone)."""
    skip_corrupt: bool = False
    manifest_file: str | None = None
    """The manifest's own path, which an error about one of its values names."""

    def recorded(self) -> Profile | None:
        """What the manifest's stats say, if there is a manifest."""
        if self.manifest is None:
            return None
        return manifest_profile(self.manifest, self.src, self.manifest_file or manifest_path(self.src))

    def profile(self, rules: Sequence[Drift], run: RunSettings, executor: Executor) -> Profile:
        """From the manifest's stats when they answer every rule, else from one pass over the data."""
        recorded = self.recorded()
        if self.data is None or (recorded is not None and all(_answers(recorded, r) for r in rules)):
            return recorded
        dataset = open_checked(self.data, run, executor, self.skip_corrupt)  # under check's limits, as SRC is
        plan = scan_plan(rules, dataset.schema, None, 0, run.budget)
        return profile_of(measure(dataset, plan, run, executor, needs_rows=True), rules)


def open_checked(src: str, run: RunSettings, executor: Executor, skip_corrupt: bool,
                 format: str | None = None) -> Dataset:
    """SRC, or a baseline's data, opened under check's limits (its --memory bounds what one unit decompresses to)."""
    return open_dataset(src, format=format, skip_corrupt=skip_corrupt, max_record_bytes=run.max_record_bytes,
                        memory=run.budget, executor=executor)


def open_baseline(spec: str, run: RunSettings, executor: Executor, skip_corrupt: bool = False) -> Baseline:
    """A dataset (file, directory, glob), a batchtool output directory, or a manifest file (its data optional)."""
    if fs.is_file(spec) and spec.endswith(".json"):
        manifest = read_manifest_file(spec)
        directory = os.path.dirname(spec) or "."
        beside = all(fs.is_file(f.path) for f in output_files(directory, manifest))
        return Baseline(spec, schema_from_json(manifest["schema"]), manifest, directory if beside else None,
                        skip_corrupt, spec)
    manifest = read_manifest(spec) if fs.is_dir(spec) else None
    if manifest is not None and isinstance(manifest.get("schema"), str):
        return Baseline(spec, schema_from_json(manifest["schema"]), manifest, spec, skip_corrupt)
    return Baseline(spec, open_checked(spec, run, executor, skip_corrupt).schema, None, spec, skip_corrupt)


def manifest_profile(manifest: dict, src: str, path: str) -> Profile:
    """Rows, and the class counts stratify records (the counts it wrote, per class of its label column), each
    value validated (an error names `path`, the manifest file, and the key)."""
    stats = Recorded.of(manifest, path)
    counts, label = stats.class_counts("class_counts_after"), stats.text("label")
    classes = {label: counts} if counts is not None and label is not None else {}
    return Profile(src, int(manifest["output"]["rows"]), classes)


def _answers(profile: Profile, rule: Drift) -> bool:
    if isinstance(rule, DriftProportions):
        return rule.column in profile.classes
    if isinstance(rule, DriftLengths):
        return rule.column in profile.quantiles
    if isinstance(rule, DriftNulls):
        return all(c in profile.nulls for c in rule.columns)
    return True


def resolve_drift(rule: Drift, schema: pa.Schema, baseline: Baseline) -> Drift | RuleResult:
    """The rule with its data-dependent defaults filled in, or SKIP when there is nothing to compare: SRC has no
    column to compare by default, or the baseline is a manifest without data that does not record the statistic.

    A column named explicitly must exist in both; a default one is taken from SRC.
    """
    resolved = _resolve(rule, schema, baseline)
    if baseline.data is None and isinstance(resolved, Drift) \
            and not _answers(baseline.recorded(), resolved):
        what = {DriftProportions: "class counts", DriftLengths: "lengths", DriftNulls: "null counts"}[type(rule)]
        return skipped(rule, f"the baseline manifest {baseline.src} records no {what} and has no data beside it "
                             "to count them")
    return resolved


def _resolve(rule: Drift, schema: pa.Schema, baseline: Baseline) -> Drift | RuleResult:
    if isinstance(rule, (DriftProportions, DriftLengths)):
        column = rule.column
        if column is None:
            column = default_label(schema) if isinstance(rule, DriftProportions) else default_length(schema)
            if column is None:
                flag, what = (("--label", "integer 'label' column") if isinstance(rule, DriftProportions)
                              else ("--length", "list column"))
                return skipped(rule, f"SRC has no {what} to compare (set the rule's column, or pass {flag} COL)")
        _in_baseline(rule, [column], baseline)
        return dataclasses.replace(rule, column=column)
    if isinstance(rule, DriftNulls):
        if rule.columns is not None:
            _in_baseline(rule, rule.columns, baseline)
            return rule
        shared = tuple(c for c in schema.names if c in baseline.schema.names)
        if not shared:
            return skipped(rule, f"SRC and the baseline {baseline.src} share no column")
        return dataclasses.replace(rule, columns=shared)
    return rule


def _in_baseline(rule: Rule, columns: Sequence[str], baseline: Baseline) -> None:
    """The baseline has the columns, of the type the rule needs of them in SRC too."""
    expected = LABEL if isinstance(rule, DriftProportions) else LENGTH if isinstance(rule, DriftLengths) else None
    for c in columns:
        need(rule.label, baseline.schema, c, expected, f"the baseline {baseline.src}")


# -------------------------------------------------------------------------------------------- judging

def judge_drift(rule: Drift, mine: Profile, base: Profile, limit: int) -> RuleResult:
    """SRC's statistic against the baseline's (both profiles answer every resolved rule)."""
    judges: dict[type, Callable[..., RuleResult]] = {
        DriftRows: _rows, DriftProportions: _proportions, DriftLengths: _lengths, DriftNulls: _nulls}
    return judges[type(rule)](rule, mine, base, limit)


def _within(deviation: float, tolerance: float) -> bool:
    """deviation <= tolerance, forgiving float noise: 85 rows of 100 are within 0.15 of the baseline's."""
    return deviation <= tolerance + 1e-12


def _relative(value: float, reference: float) -> float:
    """|value / reference - 1|: 0 when both are 0, infinite when only the reference is."""
    if reference:
        return abs(value / reference - 1)
    return 0.0 if not value else math.inf


def _rows(rule: DriftRows, mine: Profile, base: Profile, limit: int) -> RuleResult:
    ratio = mine.rows / base.rows if base.rows else (1.0 if not mine.rows else math.inf)
    bound = f"rows / baseline rows in [{max(0.0, 1 - rule.tolerance):g}, {1 + rule.tolerance:g}]"
    measured = f"{plural(mine.rows, 'row')}, baseline {base.rows:,} (ratio {ratio:.4f})"
    return verdict(rule, _within(_relative(mine.rows, base.rows), rule.tolerance), measured, bound,
                   round(ratio, 6) if math.isfinite(ratio) else None)


def _proportions(rule: DriftProportions, mine: Profile, base: Profile, limit: int) -> RuleResult:
    ours, theirs = mine.classes[rule.column], base.classes[rule.column]
    n, m = sum(ours.values()), sum(theirs.values())
    bound = f"|share - baseline share| <= {rule.tolerance:g} per class"
    if not n or not m:
        return verdict(rule, False, f"no labels in {'SRC' if not n else 'the baseline'}", bound)
    rows = []
    for k in sorted(set(ours) | set(theirs)):
        p, q = ours.get(k, 0) / n, theirs.get(k, 0) / m
        rows.append((abs(p - q), k, p, q))
    worst = max(rows, key=lambda r: (r[0], -r[1]))
    bad = [Offender(f"class {k}: {p:.4f} of labels, baseline {q:.4f} (difference {d:.4f})")
           for d, k, p, q in rows if not _within(d, rule.tolerance)]
    d, k, p, q = worst
    return verdict(rule, not bad, f"max difference {d:.4f} (class {k}: {p:.4f}, baseline {q:.4f})", bound,
                   round(d, 6), len(bad), bad[:limit])


def _lengths(rule: DriftLengths, mine: Profile, base: Profile, limit: int) -> RuleResult:
    ours, theirs = mine.quantiles[rule.column], base.quantiles[rule.column]
    diffs = {k: _relative(ours[k], theirs[k]) for k, _ in Length.QUANTILES}
    bad = [Offender(f"{k}: {ours[k]:,}, baseline {theirs[k]:,} (relative difference {d:.4f})")
           for k, d in diffs.items() if not _within(d, rule.tolerance)]
    worst = max(diffs.values())
    measured = f"{rule.column}: " + ", ".join(f"{k} {ours[k]:,} (baseline {theirs[k]:,})" for k in diffs)
    return verdict(rule, not bad, measured, f"|q / baseline q - 1| <= {rule.tolerance:g} for p50, p90, p99",
                   round(worst, 6) if math.isfinite(worst) else None, len(bad), bad[:limit])


def _nulls(rule: DriftNulls, mine: Profile, base: Profile, limit: int) -> RuleResult:
    def rate(profile: Profile, column: str) -> float:
        return profile.nulls[column] / profile.rows if profile.rows else 0.0

    rows = [(abs(rate(mine, c) - rate(base, c)), c, rate(mine, c), rate(base, c)) for c in rule.columns]
    worst = max(rows, key=lambda r: r[0])
    bad = [Offender(f"{c}: {p:.4f} null, baseline {q:.4f} (difference {d:.4f})")
           for d, c, p, q in rows if not _within(d, rule.tolerance)]
    d, c, p, q = worst
    measured = (f"max difference {d:.4f} ({c}: {p:.4f}, baseline {q:.4f})" if d
                else f"same null shares in {plural(len(rows), 'column')}")
    return verdict(rule, not bad, measured, f"|null share - baseline's| <= {rule.tolerance:g} per column",
                   round(d, 6), len(bad), bad[:limit])
