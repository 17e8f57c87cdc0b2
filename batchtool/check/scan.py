"""`check`'s one streaming pass: the plan of what each chunk must yield, the per-chunk scan, and what it measured.

The pass reuses `stats.chunk_stats` (rows, label counts, length histograms, null and NaN counts)
and adds, per chunk, the first offending rows of row-level rules and 64-bit hashes for the
unique-key and duplicate-row rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import fs, progress, rng
from batchtool.check.columns import FLOATS, LABEL, LENGTH, SEQUENCE, need
from batchtool.check.hashing import row_hashes
from batchtool.exec.distinct import KeyPairs, key_pairs
from batchtool.check.report import Offender
from batchtool.check.rules import (ClassProportions, DriftLengths, DriftNulls, DriftProportions, LabelRange, Length,
                                   MinClassRows, NoDuplicateRows, NoNan, NoNulls, Rule, SameLength, Unique)
from batchtool.io.dataset import Chunk, Dataset, ReadReport, Shard
from batchtool.core.run_settings import RunSettings
from batchtool.core.errors import SchemaError
from batchtool.ops.labels import MAX_CLASSES
from batchtool.core.runner import Executor
from batchtool.io.spill import make_temporary_dir
from batchtool.io.workspace import Workspace
from batchtool.io.stats import DatasetStats, check_lengths, chunk_stats, is_sequence_type, lengths_of

_ROW_LEVEL = (NoNulls, NoNan, LabelRange, Length, SameLength)
_KEYED = (Unique, NoDuplicateRows)


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
    memory: int
    """check's --memory: bounds the search for repeated unique keys and duplicate rows, and what a length in
    the data may make a length histogram take."""

    def stats_index(self, label: str | None = None, length: str | None = None) -> int:
        return next(i for i, (a, b) in enumerate(self.pairs) if (label is None or a == label)
                    and (length is None or b == length))


def scan_plan(rules: Sequence[Rule], schema: pa.Schema, key: str | None, limit: int, memory: int) -> Plan:
    """Check column types once, then list what each chunk must yield."""
    labels, lengths, nulls, nans, keys = [], [], [], [], []
    for rule in rules:
        if isinstance(rule, (LabelRange, ClassProportions, MinClassRows, DriftProportions)):
            need(rule.label, schema, rule.column, LABEL)
            labels.append(rule.column)
        elif isinstance(rule, (Length, DriftLengths)):
            need(rule.label, schema, rule.column, LENGTH)
            lengths.append(rule.column)
        elif isinstance(rule, (NoNulls, DriftNulls)):
            nulls += rule.columns
        elif isinstance(rule, NoNan):
            for c in rule.columns:
                need(rule.label, schema, c, FLOATS)
            nans += rule.columns
        elif isinstance(rule, SameLength):
            for c in rule.columns:
                need(rule.label, schema, c, SEQUENCE)
        elif isinstance(rule, _KEYED):
            keys.append(rule.columns)
    row_rules = tuple(r for r in rules if isinstance(r, _ROW_LEVEL))
    if key is not None and (row_rules or keys):
        need("--key", schema, key)
    reads = [c for r in rules for c in r.reads()] + ([key] if key is not None and row_rules else [])
    labels, lengths = list(dict.fromkeys(labels)), list(dict.fromkeys(lengths))
    pairs = tuple(itertools.zip_longest(labels, lengths)) or ((None, None),)
    return Plan(tuple(dict.fromkeys(reads)), pairs, tuple(dict.fromkeys(nulls)), tuple(dict.fromkeys(nans)),
                row_rules, tuple(dict.fromkeys(keys)), key if (row_rules or keys) else None, limit, memory)


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


def scan_chunk(chunk: Chunk, plan: Plan, locate: Callable[[int], str]) -> Scan:
    """A pure function of the chunk and the plan (`locate` names a row in an error)."""
    for _, length in plan.pairs:
        if length is not None:
            check_lengths(chunk, length, plan.memory)
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


def measure(dataset: Dataset, plan: Plan, run: RunSettings, executor: Executor, needs_rows: bool) -> Measures:
    """The one streaming pass on the executor (or, when no rule reads data, a record count or nothing).

    The unique-key and duplicate-row hashes go to a scratch directory of run.tmp_dir (batchtool.exec.distinct);
    the plan's memory bounds the search for their repeats.
    """
    report = ReadReport()
    stats = [DatasetStats() for _ in plan.pairs]
    offenses: dict[str, Offenses] = {}
    repeats: dict[tuple[str, ...], tuple[int, list[Offender]]] = {}
    if not plan.columns:
        rows = count_records(dataset, report, executor) if needs_rows and dataset.num_rows is None \
            else dataset.num_rows
        return Measures(dataset, plan, rows, stats, offenses, repeats, report)
    share = plan.memory // max(1, len(plan.keys))
    scratch = make_temporary_dir("batchtool-check-", run.tmp_dir) if plan.keys else ""
    try:
        space = Workspace(scratch, dataset.src, run.tmp_dir)
        pairs = [key_pairs(space, share) for _ in plan.keys]
        with progress.bar("check: scan", dataset.progress_rows, run.shown) as bar:
            for index, scan in enumerate(executor.map(lambda task: scan_chunk(task(), plan, dataset.locate),
                                                      dataset.tasks(plan.columns, report))):
                for (label, _), total, part in zip(plan.pairs, stats, scan.stats):
                    total.merge(part)
                    if len(total.label_counts) > MAX_CLASSES:
                        raise SchemaError(f"{dataset.src}: column {label!r} holds more than {MAX_CLASSES:,} distinct "
                                          "labels; the label rules count rows per class (check the label column)")
                for name, part in scan.offenses.items():
                    offenses.setdefault(name, Offenses()).merge(part, plan.limit)
                for keys, hashes in zip(pairs, scan.hashes):
                    keys.write(index, hashes, scan.ids)
                bar.update(len(scan.ids))
        measures = Measures(dataset, plan, stats[0].rows, stats, offenses, repeats, report)
        for cols, keys in zip(plan.keys, pairs):
            repeats[cols] = confirm_repeats(measures, cols, keys, executor)
    finally:
        if scratch:
            fs.remove_tree(scratch)
    return measures


def count_records(dataset: Dataset, report: ReadReport, executor: Executor) -> int:
    """Rows of a dataset whose files do not say (records of a stream) without decoding them, a shard per task."""
    def count(shard: Shard) -> tuple[int, ReadReport]:
        local = ReadReport()
        return dataset.spec.count_rows(dataset, shard, local), local

    rows = 0
    for n, local in executor.map(count, dataset.shards):
        rows += n
        report.merge(local)
    return rows


def confirm_repeats(m: Measures, columns: tuple[str, ...], keys: KeyPairs,
                    executor: Executor) -> tuple[int, list[Offender]]:
    """Repeated keys confirmed on the real values (KeyPairs.repeats), as offenders naming the row each repeats."""
    count, found = keys.repeats(m.dataset, columns, executor, m.plan.limit, [m.plan.key] if m.plan.key else [])
    offenders = []
    for repeat in found:
        earlier = m.offender(repeat.first, None, "")
        offenders.append(m.offender(repeat.id, repeat.row[m.plan.key] if m.plan.key else None,
                                    f"same as {earlier.file}, {m.dataset.spec.unit} {earlier.row}"))
    return count, offenders


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
