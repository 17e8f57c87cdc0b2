"""`check`'s plan: which rules to check and which of them the one pass answers, resolved against the data.

The rules are the ones given, or a batchtool output's manifest rules; drift rules are resolved
against the baseline, defaults that depend on the data are filled, and a rule whose column is
missing after the schema rule failed is reported as not evaluated instead of stopping the check.
What each chunk of the pass must yield is the scan's plan (scan.scan_plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import pyarrow as pa

from batchtool.core import budget
from batchtool.check.columns import need
from batchtool.check.drift import Baseline, resolve_drift
from batchtool.check.report import ERROR, FAIL, RuleResult
from batchtool.check.rules import (MANIFEST_RULES, Crc, DriftRows, Length, NoDuplicateRows, RowCount, Rule, RuleSet,
                                   Schema)
from batchtool.io.dataset import Dataset
from batchtool.core.errors import SchemaError, UsageError
from batchtool.io.stats import default_length

DEFAULT_MAX_OFFENDERS = 5
OFFENDER_BYTES = 512
"""What one listed offender holds: its file, row, key and description (and, for a repeat, the row fetched to
confirm it)."""
NEEDS_ROWS = (RowCount, Crc, DriftRows)
"""Rules answered by the row count: the pass counts the records even when no rule reads a column."""


def rules_to_check(rules: RuleSet, manifest: dict | None) -> RuleSet:
    """The rules given, or with none a batchtool output's manifest rules; UsageError when that leaves nothing to
    check, or drift rules have no baseline."""
    if not rules.rules:
        if manifest is None:
            raise UsageError("no rules to check: pass --rules FILE or rule flags such as --num-classes or --unique "
                             "(a batchtool output directory is checked against its manifest)")
        rules = dataclasses.replace(rules, rules=tuple(cls(cls.kind) for cls in MANIFEST_RULES))
    if rules.drift and rules.baseline is None:
        raise UsageError(f"{rules.drift[0].label}: compares SRC with a baseline: pass --baseline OTHER or set "
                         "baseline in the rules file")
    return rules


def offender_limit(flag: int | None, rules: RuleSet, memory: int) -> int:
    """Offenders listed per rule: --max-offenders, else the rules file's max_offenders, else the default; every
    rule may list that many, which must fit --memory's share."""
    limit = next(v for v in (flag, rules.max_offenders, DEFAULT_MAX_OFFENDERS) if v is not None)
    n = len(rules.rules)
    budget.check_fits("max_offenders",
                      f"listing up to {limit:,} offending rows for each of {n} rule{'s' if n != 1 else ''}",
                      limit * max(n, 1) * OFFENDER_BYTES, memory, "give a smaller {max_offenders} or a larger {memory}",
                      value=limit)
    return limit


def data_rules(rules: RuleSet, dataset: Dataset, baseline: Baseline | None,
               decided: Mapping[str, RuleResult]) -> Iterator[Rule | RuleResult]:
    """Each rule not `decided` yet, in order: resolved for the pass, or its result when it cannot run.

    A drift rule the baseline cannot answer is skipped; a rule that reads a missing column is not
    evaluated if the schema rule failed (that failure says why), else the missing column is an error.
    """
    resolved: dict[str, Rule] = {}
    skipped = set()
    for rule in rules.drift:
        outcome = resolve_drift(rule, dataset.schema, baseline)
        if isinstance(outcome, RuleResult):
            skipped.add(rule.name)
            yield outcome
        else:
            resolved[rule.name] = outcome
    pending = [resolved.get(r.name) or resolve(r, dataset.schema) for r in rules.rules
               if r.name not in decided and r.name not in skipped]
    schema_failed = [r.name for r in rules.rules if isinstance(r, Schema) and decided[r.name].status == FAIL]
    for rule in pending:
        missing = [c for c in rule.reads() if c not in dataset.schema.names]
        if missing and schema_failed:
            yield not_evaluated(rule, f"not evaluated: no column {missing[0]!r} (see rule {schema_failed[0]!r})")
        else:
            for column in missing:
                need(rule.label, dataset.schema, column, source=dataset.src)
            yield rule


def resolve(rule: Rule, schema: pa.Schema) -> Rule:
    """Fill defaults that depend on the data (the length column, every column for duplicate rows)."""
    if isinstance(rule, Length) and rule.column is None:
        column = default_length(schema)
        if column is None:
            raise SchemaError(f"{rule.label}: no list column whose length to check; set its column")
        return dataclasses.replace(rule, column=column)
    if isinstance(rule, NoDuplicateRows) and rule.columns is None:
        return dataclasses.replace(rule, columns=tuple(schema.names))
    return rule


def not_evaluated(rule: Rule, why: str) -> RuleResult:
    """The result of a rule that could not run (an ERROR, not a FAIL: the data was not judged)."""
    return RuleResult(rule.name, rule.kind, ERROR, why, "-")
