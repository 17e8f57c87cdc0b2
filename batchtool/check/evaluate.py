"""`check`: evaluate rules on a dataset: plan what to read, run the one pass (`scan`), judge each rule.

Data rules are evaluated in one streaming pass that reads only the columns the rules need
(batchtool/check/scan.py); drift rules add their columns to it and compare with a baseline
(drift.py). Rules that need no data (schema, checksums, padding efficiency, row counts of
Parquet) read only metadata or the manifest; manifest verification (verify.py) and batch
rules (batches.py) read footers or one small column.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import time
from dataclasses import dataclass
from functools import singledispatch

import pyarrow as pa

from batchtool import formats, fs
from batchtool.check.batches import BATCH_RULES, judge_batches
from batchtool.check.drift import judge_drift, open_baseline, profile_of, resolve_drift
from batchtool.check.report import ERROR, FAIL, CheckResult, Offender, RuleResult, every, plural
from batchtool.check.report import verdict as _result
from batchtool.check.rules import (MANIFEST_RULES, Checksums, ClassProportions, Crc, Drift, DriftRows, LabelRange,
                                   Length, MinClassRows, NoDuplicateRows, NoNan, NoNulls, PaddingEfficiency, RowCount,
                                   Rule, RuleSet, SameLength, Schema, Unique)
from batchtool.check.scan import Measures, make_plan, measure
from batchtool.check.verify import VERIFY_RULES, output_stats, verify
from batchtool.dataset import Dataset, open_dataset, resolve_paths
from batchtool.engines import with_engine
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.job import RunSettings
from batchtool.manifest import MANIFEST_NAME, OutputFile, manifest_path, output_files, read_manifest
from batchtool.runner import ordered_map
from batchtool.stats import default_length

DEFAULT_MAX_OFFENDERS = 5
_HASH_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class CheckOptions:
    """How to check and report; None means: from the rules file, else the default."""

    key: str | None = None
    """Column whose value is shown with each offending row (default: 'key' if the data has one)."""
    max_offenders: int | None = None
    memory: int = 1 << 30
    """Bytes the unique-key and duplicate-row hashes may hold before they spill to --tmp-dir."""
    tmp_dir: str | None = None
    format: str | None = None
    skip_corrupt: bool = False

    def __post_init__(self) -> None:
        if self.max_offenders is not None and self.max_offenders < 0:
            raise UsageError(f"--max-offenders {self.max_offenders}: must be >= 0")
        if self.memory <= 0:
            raise UsageError(f"--memory {self.memory}: must be positive")


@with_engine
def check(src: str, rules: RuleSet, options: CheckOptions = CheckOptions(),
          run: RunSettings = RunSettings()) -> CheckResult:
    """Evaluate every rule on SRC. A failing rule is a result (exit 1); bad usage or unreadable input raises.

    With no rule, a batchtool output directory is verified against its manifest (MANIFEST_RULES).
    When the checksum or schema rule fails, rules that then cannot run (a shard is unreadable, a
    column is missing) are reported as not evaluated instead of stopping the check.
    """
    started = time.perf_counter()
    manifest = read_manifest(src) if fs.is_dir(src) else None
    if not rules.rules:
        if manifest is None:
            raise UsageError("no rules to check: pass --rules FILE or rule flags such as --num-classes or --unique "
                             "(a batchtool output directory is checked against its manifest)")
        rules = dataclasses.replace(rules, rules=tuple(cls(cls.kind) for cls in MANIFEST_RULES))
    if rules.drift and rules.baseline is None:
        raise UsageError(f"rule {rules.drift[0].name!r} compares SRC with a baseline: pass --baseline OTHER or set "
                         "baseline in the rules file")
    limit = next(v for v in (options.max_offenders, rules.max_offenders, DEFAULT_MAX_OFFENDERS) if v is not None)
    verifying = [r for r in rules.rules if isinstance(r, VERIFY_RULES)]
    if verifying and manifest is None:
        raise InputError(f"rule {verifying[0].name!r}: {src} is not a batchtool output directory (no manifest "
                         "listing its files)")
    results: dict[str, RuleResult] = {r.name: judge_checksums(r, src, limit, run.threads)
                                      for r in rules.rules if isinstance(r, Checksums)}
    results.update(verify(verifying, src, manifest, limit, run.threads))
    dataset = None
    rows = None
    try:
        dataset = open_dataset(src, format=options.format,
                               skip_corrupt=options.skip_corrupt or any(isinstance(r, Crc) for r in rules.rules))
        rows = _check_data(dataset, rules, options, run, limit, results)
    except InputError as exc:  # unreadable data; usage errors always stop the check
        if not any(r.status == FAIL for r in results.values()):
            raise
        for rule in rules.rules:
            results.setdefault(rule.name, _not_evaluated(rule, f"not evaluated: {exc}"))
    return CheckResult(src, dataset.format if dataset else None, rows,
                       tuple(results[r.name] for r in rules.rules), time.perf_counter() - started)


def _check_data(dataset: Dataset, rules: RuleSet, options: CheckOptions, run: RunSettings, limit: int,
                results: dict[str, RuleResult]) -> int | None:
    """Metadata and batch rules first, then one pass for every data rule (drift rules against the baseline's
    profile); fills `results` and returns the row count if known."""
    for rule in rules.rules:
        if isinstance(rule, Schema):
            results[rule.name] = judge_schema(rule, dataset.schema)
        elif isinstance(rule, PaddingEfficiency) and not rule.per_bucket:
            results[rule.name] = judge_padding(rule, dataset)
        elif isinstance(rule, (PaddingEfficiency, *BATCH_RULES)):
            results[rule.name] = judge_batches(rule, dataset, limit, run.threads)
        elif isinstance(rule, Crc) and not dataset.spec.record_checksums:
            having = " or ".join(f.label for f in formats.FORMATS.values() if f.record_checksums)
            raise UsageError(f"rule {rule.name!r}: {dataset.src} is {dataset.format}; "
                             f"CRCs exist only in {having} files")
    baseline = open_baseline(rules.baseline, options.skip_corrupt) if rules.drift else None
    resolved: dict[str, Rule] = {}
    for rule in rules.drift:
        outcome = resolve_drift(rule, dataset.schema, baseline)
        if isinstance(outcome, RuleResult):
            results[rule.name] = outcome
        else:
            resolved[rule.name] = outcome
    pending = [resolved.get(r.name) or resolve(r, dataset.schema) for r in rules.rules if r.name not in results]
    schema_failed = [r.name for r in rules.rules if isinstance(r, Schema) and results[r.name].status == FAIL]
    runnable = []
    for rule in pending:
        missing = [c for c in rule.reads() if c not in dataset.schema.names]
        if missing and schema_failed:
            results[rule.name] = _not_evaluated(rule, f"not evaluated: no column {missing[0]!r} "
                                                      f"(see rule {schema_failed[0]!r})")
        else:
            dataset.check_columns(missing)
            runnable.append(rule)
    key = options.key or rules.key or ("key" if "key" in dataset.schema.names else None)
    plan = make_plan(runnable, dataset.schema, key, limit)
    measures = measure(dataset, plan, run, needs_rows=any(isinstance(r, (RowCount, Crc, DriftRows)) for r in runnable),
                       memory=options.memory, tmp_dir=options.tmp_dir)
    drift = [r for r in runnable if isinstance(r, Drift)]
    profiles = (profile_of(measures, drift), baseline.profile(drift, run)) if drift else ()
    for rule in runnable:
        results[rule.name] = (judge_drift(rule, *profiles, limit) if isinstance(rule, Drift)
                              else judge(rule, measures))
    return measures.rows


def resolve(rule: Rule, schema: pa.Schema) -> Rule:
    """Fill defaults that depend on the data (the length column, every column for duplicate rows)."""
    if isinstance(rule, Length) and rule.column is None:
        column = default_length(schema)
        if column is None:
            raise SchemaError(f"rule {rule.name!r}: no list column whose length to check; set its column")
        return dataclasses.replace(rule, column=column)
    if isinstance(rule, NoDuplicateRows) and rule.columns is None:
        return dataclasses.replace(rule, columns=tuple(schema.names))
    return rule


def _not_evaluated(rule: Rule, why: str) -> RuleResult:
    return RuleResult(rule.name, rule.kind, ERROR, why, "-")



# -------------------------------------------------------------------------------------------- judging

@singledispatch
def judge(rule: Rule, m: Measures) -> RuleResult:
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
    return _result(rule, not problems, measured, bound, len(problems), len(problems),
                   [Offender(p) for p in problems])


def judge_padding(rule: PaddingEfficiency, dataset: Dataset) -> RuleResult:
    """A padding (or, for PackingEfficiency, packing) efficiency from SRC's manifest, against `min`."""
    manifest = dataset.manifest
    if manifest is None:
        raise InputError(f"rule {rule.name!r}: {dataset.src} has no batchtool manifest ({MANIFEST_NAME}) to read "
                         f"the {rule.stat.replace('_', ' ')} from (check the output directory of "
                         f"{rule.written_by.replace(' and ', ' or ')})")
    value = output_stats(manifest).get(rule.stat)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InputError(f"rule {rule.name!r}: {manifest_path(dataset.src)} records no "
                         f"stats.{rule.stat} (written by {manifest.get('command')!r}; {rule.written_by} "
                         "output records it)")
    return _result(rule, value >= rule.min, f"{value:.4f}", f">= {rule.min:g}", value)


def judge_checksums(rule: Checksums, src: str, limit: int, threads: int) -> RuleResult:
    """Size and sha256 of every file the manifest lists, plus data files it does not list."""
    manifest = read_manifest(src) if fs.is_dir(src) else None
    if manifest is None:
        raise InputError(f"rule {rule.name!r}: {src} is not a batchtool output directory (no {MANIFEST_NAME} "
                         "listing the files and their checksums)")
    files = output_files(src, manifest)
    problems = [p for p in ordered_map(file_problem, files, threads) if p is not None]
    listed = {os.path.normpath(f.name) for f in files}
    problems += [Offender("not listed in the manifest", path) for path in _data_files(src)
                 if os.path.normpath(os.path.relpath(path, src)) not in listed]
    measured = (f"{every(len(files), 'file')} {'matches' if len(files) == 1 else 'match'}" if not problems
                else "the only file differs" if len(files) == 1 else f"{len(problems)} of {len(files)} files differ")
    return _result(rule, not problems, measured, "size and sha256 as in the manifest", len(problems),
                   len(problems), problems[:limit])


def _data_files(src: str) -> list[str]:
    try:
        return resolve_paths(src)
    except InputError:  # every data file is gone: each is reported missing already
        return []


def file_problem(file: OutputFile) -> Offender | None:
    """What is wrong with one listed output file, or None."""
    if not fs.is_file(file.path):
        return Offender("missing", file.path)
    size = fs.file_size(file.path)
    if size != file.bytes:
        what = "truncated" if size < file.bytes else "grown"
        return Offender(f"{what}: {size:,} bytes, the manifest says {file.bytes:,}", file.path)
    h = hashlib.sha256()
    with fs.open_input(file.path, sequential=True) as f:
        while block := f.read(_HASH_READ_BYTES):
            h.update(block)
    if h.hexdigest() != file.sha256:
        return Offender(f"changed: sha256 {h.hexdigest()[:16]}..., the manifest says {file.sha256[:16]}...",
                        file.path)
    return None


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
    return _result(rule, not total, measured, f"0 {what}s in " + ", ".join(rule.columns), total, rows, offenders)


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
    return _result(rule, not total, measured, f"{rule.column} in [0, {rule.num_classes})", total, rows, offenders)


@judge.register
def _(rule: ClassProportions, m: Measures) -> RuleResult:
    counts = m.label_stats(rule.column).label_counts
    n = sum(counts.values())
    bound = f"|p - target| <= {rule.tolerance:g}" + (" x target" if rule.relative else "")
    if not n:
        return _result(rule, False, "no labels", bound, None)
    classes = sorted(set(range(len(rule.target))) | set(counts))
    worst: tuple[float, int] = (0.0, classes[0])
    offenders = []
    for k in classes:
        p = counts.get(k, 0) / n
        t = rule.target[k] if 0 <= k < len(rule.target) else 0.0
        dev = _deviation(p, t, rule.relative)
        worst = max(worst, (dev, k))
        if dev > rule.tolerance:
            offenders.append(Offender(f"class {k}: {p:.4f} of labels, target {t:.4f} (deviation {dev:.4f})"))
    dev, k = worst
    p = counts.get(k, 0) / n
    t = rule.target[k] if 0 <= k < len(rule.target) else 0.0
    measured = f"max deviation {dev:.4f} (class {k}: {p:.4f}, target {t:.4f})"
    return _result(rule, dev <= rule.tolerance, measured, bound, round(dev, 6) if math.isfinite(dev) else None,
                   len(offenders), offenders)


def _deviation(p: float, t: float, relative: bool) -> float:
    """|p - t|, or as a fraction of t (infinite for any share of a class whose target is 0)."""
    if not relative:
        return abs(p - t)
    return abs(p - t) / t if t > 0 else (math.inf if p else 0.0)


@judge.register
def _(rule: MinClassRows, m: Measures) -> RuleResult:
    counts = m.label_stats(rule.column).label_counts
    classes = range(rule.num_classes) if rule.num_classes is not None else sorted(counts)
    bound = f">= {plural(rule.min_rows, 'row')} per class" + (f" (classes 0..{rule.num_classes - 1})"
                                                      if rule.num_classes is not None else "")
    if not classes:
        return _result(rule, False, "no labels", bound, 0)
    smallest = min(classes, key=lambda k: (counts.get(k, 0), k))
    low = [k for k in classes if counts.get(k, 0) < rule.min_rows]
    return _result(rule, not low, f"smallest class {smallest}: {plural(counts.get(smallest, 0), 'row')}", bound,
                   counts.get(smallest, 0), len(low),
                   [Offender(f"class {k}: {plural(counts.get(k, 0), 'row')}") for k in low])


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
    return _result(rule, not bad, f"{rule.column}: {measured}", ", ".join(bounds), value, rows, offenders)


@judge.register
def _(rule: SameLength, m: Measures) -> RuleResult:
    rows, offenders = m.rule_offenses(rule)
    measured = "every row agrees" if not rows else f"{plural(rows, 'row')} {'disagrees' if rows == 1 else 'disagree'}"
    return _result(rule, not rows, measured, "same steps in " + ", ".join(rule.columns), rows, rows, offenders)


@judge.register(Unique)
@judge.register(NoDuplicateRows)
def _(rule: Rule, m: Measures) -> RuleResult:
    count, offenders = m.repeats[rule.columns]
    what = "key" if isinstance(rule, Unique) else "row"
    measured = (f"{every(m.rows, what)} distinct" if not count
                else f"{plural(count, 'row')} {'repeats' if count == 1 else 'repeat'} an earlier {what}")
    cols = ", ".join(rule.columns) if isinstance(rule, Unique) or len(rule.columns) <= 3 else "all columns"
    return _result(rule, not count, measured, f"0 repeated ({cols})", count, count, offenders)


@judge.register
def _(rule: RowCount, m: Measures) -> RuleResult:
    rows = m.rows
    bound = (f"[{rule.min:,}, {rule.max:,}]" if rule.min is not None and rule.max is not None
             else f">= {rule.min:,}" if rule.min is not None else f"<= {rule.max:,}")
    ok = (rule.min is None or rows >= rule.min) and (rule.max is None or rows <= rule.max)
    return _result(rule, ok, plural(rows, "row"), bound, rows)


@judge.register
def _(rule: Crc, m: Measures) -> RuleResult:
    n = m.report.corrupt_records
    files = len(m.dataset.shards)
    measured = f"all records valid in {plural(files, 'file')}" if not n else plural(n, "corrupt record")
    return _result(rule, not n, measured, "0 corrupt records", n, n,
                   [Offender(e) for e in m.report.first_errors[:m.plan.limit]])
