"""`check`: evaluate rules on a dataset in one streaming pass that reads only the columns the rules need.

The pass reuses `stats.chunk_stats` (rows, label counts, length histograms, null and NaN counts)
and adds, per chunk, the first offending rows of row-level rules and 64-bit hashes for the
unique-key and duplicate-row rules. Rules that need no data (schema, checksums, padding
efficiency, row counts of Parquet) read only metadata or the manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool import progress, rng
from batchtool.check.duplicates import HashIndex
from batchtool.check.hashing import canonical, row_hashes
from batchtool.check.report import ERROR, FAIL, PASS, CheckResult, Offender, RuleResult
from batchtool.check.rules import (Checksums, ClassProportions, Crc, LabelRange, Length, MinClassRows,
                                   NoDuplicateRows, NoNan, NoNulls, PaddingEfficiency, RowCount, Rule, RuleSet,
                                   SameLength, Schema, Unique)
from batchtool.dataset import Chunk, Dataset, ReadReport, open_dataset, read_manifest, resolve_paths
from batchtool.engines import with_engine
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.formats import tfrecord
from batchtool.job import RunSettings
from batchtool.padding import element_type
from batchtool.runner import ordered_map
from batchtool.stats import (
    DatasetStats,
    chunk_stats,
    default_length,
    is_sequence_type,
    lengths_of,
)

DEFAULT_MAX_OFFENDERS = 5
_HASH_READ_BYTES = 1 << 20
_ROW_LEVEL = (NoNulls, NoNan, LabelRange, Length, SameLength)
_KEYED = (Unique, NoDuplicateRows)


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

    When the checksum or schema rule fails, rules that then cannot run (a shard is unreadable, a
    column is missing) are reported as not evaluated instead of stopping the check.
    """
    started = time.perf_counter()
    if not rules.rules:
        raise UsageError("no rules to check: pass --rules FILE or rule flags such as --num-classes or --unique")
    limit = next(v for v in (options.max_offenders, rules.max_offenders, DEFAULT_MAX_OFFENDERS) if v is not None)
    results: dict[str, RuleResult] = {r.name: judge_checksums(r, src, limit, run.threads)
                                      for r in rules.rules if isinstance(r, Checksums)}
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
    """Schema first, then one pass for every data rule; fills `results` and returns the row count if known."""
    for rule in rules.rules:
        if isinstance(rule, Schema):
            results[rule.name] = judge_schema(rule, dataset.schema)
        elif isinstance(rule, PaddingEfficiency):
            results[rule.name] = judge_padding(rule, dataset)
        elif isinstance(rule, Crc) and dataset.format != "tfrecord":
            raise UsageError(f"rule {rule.name!r}: {dataset.src} is {dataset.format}; CRCs exist only in TFRecord files")
    pending = [resolve(r, dataset.schema) for r in rules.rules if r.name not in results]
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
    measures = measure(dataset, plan, options, run, needs_rows=any(isinstance(r, (RowCount, Crc)) for r in runnable))
    for rule in runnable:
        results[rule.name] = judge(rule, measures)
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


# ---------------------------------------------------------------------------------------------- the pass

@dataclass(frozen=True)
class Plan:
    """What the one pass computes, from the rules and the schema only."""

    columns: tuple[str, ...]
    pairs: tuple[tuple[str | None, str | None], ...]
    """(label, length) column of each chunk_stats call; the first call also counts nulls and NaN."""
    nulls: tuple[str, ...]
    nans: tuple[str, ...]
    row_rules: tuple[Rule, ...]
    keys: tuple[tuple[str, ...], ...]
    """Distinct column sets the unique and duplicate-row rules hash."""
    key: str | None
    limit: int

    def stats_index(self, label: str | None = None, length: str | None = None) -> int:
        return next(i for i, (a, b) in enumerate(self.pairs) if (label is None or a == label)
                    and (length is None or b == length))


def make_plan(rules: Sequence[Rule], schema: pa.Schema, key: str | None, limit: int) -> Plan:
    """Check column types once, then list what each chunk must yield."""
    labels, lengths, nulls, nans, keys = [], [], [], [], []
    for rule in rules:
        if isinstance(rule, (LabelRange, ClassProportions, MinClassRows)):
            _need(rule, rule.column, schema, pa.types.is_integer, "an integer label column")
            labels.append(rule.column)
        elif isinstance(rule, Length):
            _need(rule, rule.column, schema, lambda t: is_sequence_type(t) or pa.types.is_integer(t),
                  "a list column or an integer length column")
            lengths.append(rule.column)
        elif isinstance(rule, NoNulls):
            nulls += rule.columns
        elif isinstance(rule, NoNan):
            for c in rule.columns:
                _need(rule, c, schema, lambda t: pa.types.is_floating(element_type(t)),
                      "a float or list-of-float column")
            nans += rule.columns
        elif isinstance(rule, SameLength):
            for c in rule.columns:
                _need(rule, c, schema, is_sequence_type, "a list (sequence) column")
        elif isinstance(rule, _KEYED):
            keys.append(rule.columns)
    row_rules = tuple(r for r in rules if isinstance(r, _ROW_LEVEL))
    if key is not None and (row_rules or keys):
        _need_column(key, schema, "--key")
    reads = [c for r in rules for c in r.reads()] + ([key] if key is not None and row_rules else [])
    labels, lengths = list(dict.fromkeys(labels)), list(dict.fromkeys(lengths))
    pairs = tuple(itertools.zip_longest(labels, lengths)) or ((None, None),)
    return Plan(tuple(dict.fromkeys(reads)), pairs, tuple(dict.fromkeys(nulls)), tuple(dict.fromkeys(nans)),
                row_rules, tuple(dict.fromkeys(keys)), key if (row_rules or keys) else None, limit)


def _need(rule: Rule, column: str, schema: pa.Schema, ok: Callable[[pa.DataType], bool], what: str) -> None:
    _need_column(column, schema, f"rule {rule.name!r}")
    if not ok(schema.field(column).type):
        raise SchemaError(f"rule {rule.name!r}: column {column!r} is {schema.field(column).type}, expected {what}")


def _need_column(column: str, schema: pa.Schema, who: str) -> None:
    if column not in schema.names:
        raise SchemaError(f"{who}: no column {column!r} (available: {', '.join(schema.names)})")


@dataclass
class Offenses:
    """Offending rows of one rule: how many, and the first `limit` as (example id, key value, detail)."""

    count: int = 0
    found: list[tuple[int, Any, str]] = field(default_factory=list)

    def merge(self, other: Offenses, limit: int) -> None:
        self.count += other.count
        self.found += other.found[:max(0, limit - len(self.found))]


@dataclass
class Scan:
    """What one chunk contributes; computed on a worker thread, merged in order by the consumer."""

    stats: list[DatasetStats]
    offenses: dict[str, Offenses]
    hashes: list[np.ndarray]
    ids: np.ndarray


def scan_chunk(chunk: Chunk, plan: Plan) -> Scan:
    """A pure function of the chunk and the plan."""
    stats = [chunk_stats(chunk, label, length, plan.nulls if i == 0 else (), plan.nans if i == 0 else ())
             for i, (label, length) in enumerate(plan.pairs)]
    offenses = {}
    for rule in plan.row_rules:
        found = offending_rows(rule, chunk.data, stats, plan)
        if found is None:
            continue
        mask, describe = found
        idx = np.flatnonzero(mask)
        if not len(idx):
            continue
        first = idx[:plan.limit]
        keys = chunk.data.column(plan.key).take(pa.array(first)).to_pylist() if plan.key else [None] * len(first)
        offenses[rule.name] = Offenses(len(idx), [(int(chunk.ids[i]), k, describe(int(i)))
                                                  for i, k in zip(first, keys)])
    return Scan(stats, offenses, [row_hashes(chunk.data, cols) for cols in plan.keys], chunk.ids)


@dataclass
class Measures:
    """Everything the pass measured, for judging the rules."""

    dataset: Dataset
    plan: Plan
    rows: int | None
    stats: list[DatasetStats]
    offenses: dict[str, Offenses]
    repeats: dict[tuple[str, ...], tuple[int, list[Offender]]]
    report: ReadReport

    def label_stats(self, column: str) -> DatasetStats:
        return self.stats[self.plan.stats_index(label=column)]

    def length_stats(self, column: str) -> DatasetStats:
        return self.stats[self.plan.stats_index(length=column)]

    def offender(self, example_id: int, key: Any, detail: str) -> Offender:
        return Offender(detail, self.dataset.shard_of(example_id).path,
                        example_id & ((1 << rng.SHARD_BITS) - 1), key)

    def rule_offenses(self, rule: Rule) -> tuple[int, tuple[Offender, ...]]:
        o = self.offenses.get(rule.name, Offenses())
        return o.count, tuple(self.offender(*f) for f in o.found)


def measure(dataset: Dataset, plan: Plan, options: CheckOptions, run: RunSettings, needs_rows: bool) -> Measures:
    """The one streaming pass (or, when no rule reads data, a record count or nothing)."""
    report = ReadReport()
    stats = [DatasetStats() for _ in plan.pairs]
    offenses: dict[str, Offenses] = {}
    repeats: dict[tuple[str, ...], tuple[int, list[Offender]]] = {}
    if not plan.columns:
        rows = count_records(dataset, report, run.threads) if needs_rows and dataset.format == "tfrecord" \
            else dataset.num_rows
        return Measures(dataset, plan, rows, stats, offenses, repeats, report)
    budget = options.memory // max(1, len(plan.keys))
    indexes = [HashIndex(budget, options.tmp_dir) for _ in plan.keys]
    try:
        with progress.bar("check", dataset.num_rows, quiet=run.quiet) as bar:
            for scan in ordered_map(lambda task: scan_chunk(task(), plan), dataset.tasks(plan.columns, report),
                                    run.threads):
                for total, part in zip(stats, scan.stats):
                    total.merge(part)
                for name, part in scan.offenses.items():
                    offenses.setdefault(name, Offenses()).merge(part, plan.limit)
                for index, hashes in zip(indexes, scan.hashes):
                    index.add(hashes, scan.ids)
                bar.update(len(scan.ids))
        measures = Measures(dataset, plan, stats[0].rows, stats, offenses, repeats, report)
        for cols, index in zip(plan.keys, indexes):
            repeats[cols] = confirm_repeats(measures, cols, index, run.threads)
    finally:
        for index in indexes:
            index.close()
    return measures


def count_records(dataset: Dataset, report: ReadReport, threads: int) -> int:
    """Rows of a TFRecord dataset without decoding: read and CRC-check every record, shards on threads."""
    def count(path: str) -> tuple[int, ReadReport]:
        local = ReadReport()
        records = tfrecord.iter_records(path, skip_corrupt=dataset.skip_corrupt, on_corrupt=local.record)
        return sum(1 for _ in records), local

    rows = 0
    for n, local in ordered_map(count, [s.path for s in dataset.shards], threads):
        rows += n
        report.corrupt_records += local.corrupt_records
        report.first_errors = (report.first_errors + local.first_errors)[:10]
    return rows


def confirm_repeats(m: Measures, columns: tuple[str, ...], index: HashIndex,
                    threads: int) -> tuple[int, list[Offender]]:
    """Repeated keys by hash, confirmed on the real values in id order until `limit` are confirmed.

    A candidate whose values differ from its group's first row is a 64-bit hash collision and is
    not counted. So a rule fails only on a confirmed repeat, and the count is exact whenever every
    candidate got checked (always, short of more than `limit` repeats plus collisions).
    """
    target = max(m.plan.limit, 1)
    fetch = list(dict.fromkeys([*columns, *([m.plan.key] if m.plan.key else [])]))
    unit = "record" if m.dataset.format == "tfrecord" else "row"
    offenders: list[Offender] = []
    checked = refuted = 0
    want = target
    while True:
        found = index.repeats(want)
        ids, first_ids = found.ids[checked:].tolist(), found.first_ids[checked:].tolist()
        rows = fetch_rows(m.dataset, np.unique(np.array(ids + first_ids, dtype=np.uint64)), fetch, threads)
        for dup, first in zip(ids, first_ids):
            if [canonical(rows[dup][c]) for c in columns] != [canonical(rows[first][c]) for c in columns]:
                refuted += 1
                continue
            earlier = m.offender(first, None, "")
            offenders.append(m.offender(dup, rows[dup].get(m.plan.key) if m.plan.key else None,
                                        f"same as {earlier.file}, {unit} {earlier.row}"))
        checked = len(found.ids)
        if len(offenders) >= target or checked >= found.count:
            return found.count - refuted, offenders[:m.plan.limit]
        want *= 2


def fetch_rows(dataset: Dataset, ids: np.ndarray, columns: list[str], threads: int) -> dict[int, dict]:
    """Rows by example id, reading only the shards that hold them and stopping after the last."""
    if not len(ids):
        return {}
    shards = {int(i) >> rng.SHARD_BITS for i in ids}
    subset = dataclasses.replace(dataset, shards=tuple(s for s in dataset.shards if s.index in shards))
    rows: dict[int, dict] = {}
    with closing(subset.chunks(columns, threads)) as chunks:
        for chunk in chunks:
            hit = np.isin(chunk.ids, ids)
            if hit.any():
                taken = chunk.filter(hit)
                rows.update(zip(taken.ids.tolist(), taken.data.to_pylist()))
            if len(rows) == len(ids):
                break
    return rows


# ------------------------------------------------------------------------------------- offending rows

Found = tuple[np.ndarray, Callable[[int], str]] | None
"""A mask of a chunk's offending rows and a function describing row i; None when the chunk has none."""


@singledispatch
def offending_rows(rule: Rule, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    raise NotImplementedError(type(rule).__name__)


@offending_rows.register
def _(rule: NoNulls, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    nulls = {c: batch.column(c).is_null().to_numpy(zero_copy_only=False)
             for c in rule.columns if batch.column(c).null_count}
    if not nulls:
        return None
    return (np.logical_or.reduce(list(nulls.values())),
            lambda i: "null in " + ", ".join(repr(c) for c, m in nulls.items() if m[i]))


@offending_rows.register
def _(rule: NoNan, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    nans = {c: nan_rows(batch.column(c)) for c in rule.columns if stats[0].nan_counts[c]}
    if not nans:
        return None
    return (np.logical_or.reduce(list(nans.values())),
            lambda i: "NaN in " + ", ".join(repr(c) for c, m in nans.items() if m[i]))


def nan_rows(arr: pa.Array) -> np.ndarray:
    """Mask of the rows holding a NaN anywhere inside (nested lists included)."""
    out = np.zeros(len(arr), dtype=bool)
    rows = np.arange(len(arr))
    while is_sequence_type(arr.type):
        rows = rows[pc.list_parent_indices(arr).to_numpy()]
        arr = arr.flatten()
    out[rows[pc.fill_null(pc.is_nan(arr), False).to_numpy(zero_copy_only=False)]] = True
    return out


@offending_rows.register
def _(rule: LabelRange, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    st = stats[plan.stats_index(label=rule.column)]
    if not st.label_nulls and all(0 <= k < rule.num_classes for k in st.label_counts):
        return None
    arr = batch.column(rule.column)
    values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
    null = arr.is_null().to_numpy(zero_copy_only=False)
    return null | (values < 0) | (values >= rule.num_classes), \
        lambda i: f"label {'null' if null[i] else int(values[i])}"


@offending_rows.register
def _(rule: Length, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    counts = stats[plan.stats_index(length=rule.column)].length_counts
    low = rule.min is not None and counts[:rule.min].any()
    high = rule.max is not None and counts[rule.max + 1:].any()
    if not (low or high):
        return None
    lens = lengths_of(batch, rule.column)
    mask = np.zeros(len(lens), dtype=bool)
    if low:
        mask |= lens < rule.min
    if high:
        mask |= lens > rule.max
    return mask, lambda i: f"{rule.column!r} length {lens[i]}"


@offending_rows.register
def _(rule: SameLength, batch: pa.RecordBatch, stats: list[DatasetStats], plan: Plan) -> Found:
    lens = {c: lengths_of(batch, c) for c in rule.columns}
    first = lens[rule.columns[0]]
    mask = np.logical_or.reduce([v != first for v in lens.values()])
    return mask, lambda i: ", ".join(f"{c!r} {v[i]} steps" for c, v in lens.items())


# -------------------------------------------------------------------------------------------- judging

def _result(rule: Rule, ok: bool, measured: str, bound: str, value: Any = None, offending: int = 0,
            offenders: Sequence[Offender] = ()) -> RuleResult:
    return RuleResult(rule.name, rule.kind, PASS if ok else FAIL, measured, bound, value, offending,
                      tuple(offenders))


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
    measured = (f"all {len(rule.columns)} columns as expected" if not problems
                else "; ".join(problems[:2]) + (f"; {len(problems) - 2} more" if len(problems) > 2 else ""))
    return _result(rule, not problems, measured, bound, len(problems), len(problems),
                   [Offender(p) for p in problems])


def judge_padding(rule: PaddingEfficiency, dataset: Dataset) -> RuleResult:
    """A padding (or, for PackingEfficiency, packing) efficiency from SRC's manifest, against `min`."""
    manifest = dataset.manifest
    if manifest is None:
        raise InputError(f"rule {rule.name!r}: {dataset.src} has no batchtool manifest.json to read the "
                         f"{rule.stat.replace('_', ' ')} from (check the output directory of "
                         f"{rule.written_by.replace(' and ', ' or ')})")
    value = manifest.get("stats", {}).get(rule.stat)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InputError(f"rule {rule.name!r}: {os.path.join(dataset.src, 'manifest.json')} records no "
                         f"stats.{rule.stat} (written by {manifest.get('command')!r}; {rule.written_by} "
                         "output records it)")
    return _result(rule, value >= rule.min, f"{value:.4f}", f">= {rule.min:g}", value)


def judge_checksums(rule: Checksums, src: str, limit: int, threads: int) -> RuleResult:
    """Size and sha256 of every file manifest.json lists, plus data files it does not list."""
    manifest_path = os.path.join(src, "manifest.json")
    manifest = read_manifest(src) if os.path.isdir(src) else None
    if manifest is None:
        raise InputError(f"rule {rule.name!r}: {src} is not a batchtool output directory (no manifest.json "
                         "listing the files and their checksums)")
    files = manifest.get("output", {}).get("files") if isinstance(manifest.get("output"), dict) else None
    if not isinstance(files, list):
        raise InputError(f"{manifest_path}: no output.files list to check")
    for i, entry in enumerate(files):
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)):
            raise InputError(f"{manifest_path}: output.files[{i}] lacks a path, bytes or sha256")
    problems = [p for p in ordered_map(lambda e: file_problem(src, e), files, threads) if p is not None]
    listed = {os.path.normpath(e["path"]) for e in files}
    problems += [Offender("not listed in manifest.json", path) for path in _data_files(src)
                 if os.path.normpath(os.path.relpath(path, src)) not in listed]
    measured = (f"all {len(files)} files match" if not problems
                else f"{len(problems)} of {len(files)} files differ")
    return _result(rule, not problems, measured, "size and sha256 as in manifest.json", len(problems),
                   len(problems), problems[:limit])


def _data_files(src: str) -> list[str]:
    try:
        return resolve_paths(src)
    except InputError:  # every data file is gone: each is reported missing already
        return []


def file_problem(src: str, entry: dict) -> Offender | None:
    """What is wrong with one listed output file, or None."""
    path = os.path.join(src, entry["path"])
    if not os.path.isfile(path):
        return Offender("missing", path)
    size = os.path.getsize(path)
    if size != entry["bytes"]:
        what = "truncated" if size < entry["bytes"] else "grown"
        return Offender(f"{what}: {size:,} bytes, manifest.json says {entry['bytes']:,}", path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_READ_BYTES):
            h.update(block)
    if h.hexdigest() != entry["sha256"]:
        return Offender(f"changed: sha256 {h.hexdigest()[:16]}..., manifest.json says {entry['sha256'][:16]}...",
                        path)
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
    measured = f"no {what}s" if not total else f"{total:,} {what}s (" + ", ".join(
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
                else f"{total:,} rows outside [0, {rule.num_classes}) (" + ", ".join(parts[:4])
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
    bound = f">= {rule.min_rows:,} rows per class" + (f" (classes 0..{rule.num_classes - 1})"
                                                      if rule.num_classes is not None else "")
    if not classes:
        return _result(rule, False, "no labels", bound, 0)
    smallest = min(classes, key=lambda k: (counts.get(k, 0), k))
    low = [k for k in classes if counts.get(k, 0) < rule.min_rows]
    return _result(rule, not low, f"smallest class {smallest}: {counts.get(smallest, 0):,} rows", bound,
                   counts.get(smallest, 0), len(low), [Offender(f"class {k}: {counts.get(k, 0):,} rows") for k in low])


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
    measured = "every row agrees" if not rows else f"{rows:,} rows disagree"
    return _result(rule, not rows, measured, "same steps in " + ", ".join(rule.columns), rows, rows, offenders)


@judge.register(Unique)
@judge.register(NoDuplicateRows)
def _(rule: Rule, m: Measures) -> RuleResult:
    count, offenders = m.repeats[rule.columns]
    what = "key" if isinstance(rule, Unique) else "row"
    measured = (f"all {m.rows:,} {what}s distinct" if not count
                else f"{count:,} rows repeat an earlier {what}")
    cols = ", ".join(rule.columns) if isinstance(rule, Unique) or len(rule.columns) <= 3 else "all columns"
    return _result(rule, not count, measured, f"0 repeated ({cols})", count, count, offenders)


@judge.register
def _(rule: RowCount, m: Measures) -> RuleResult:
    rows = m.rows
    bound = (f"[{rule.min:,}, {rule.max:,}]" if rule.min is not None and rule.max is not None
             else f">= {rule.min:,}" if rule.min is not None else f"<= {rule.max:,}")
    ok = (rule.min is None or rows >= rule.min) and (rule.max is None or rows <= rule.max)
    return _result(rule, ok, f"{rows:,} rows", bound, rows)


@judge.register
def _(rule: Crc, m: Measures) -> RuleResult:
    n = m.report.corrupt_records
    files = len(m.dataset.shards)
    measured = f"all records valid in {files} files" if not n else f"{n:,} corrupt record" + "s" * (n != 1)
    return _result(rule, not n, measured, "0 corrupt records", n, n,
                   [Offender(e) for e in m.report.first_errors[:m.plan.limit]])
