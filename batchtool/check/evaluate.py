"""`check`: evaluate rules on a dataset: plan what to read (plan.py), run the one pass (scan.py), judge each rule
(judge.py).

Data rules are evaluated in one streaming pass that reads only the columns the rules need
(batchtool/check/scan.py); drift rules add their columns to it and compare with a baseline
(drift.py). Rules that need no data (schema, checksums, padding efficiency, row counts of
Parquet) read only metadata or the manifest; manifest verification (verify.py) and batch
rules (batches.py) read footers or one small column.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from batchtool.core import fs
from batchtool.check.checksums import judge_checksums
from batchtool.check.drift import open_baseline, open_checked
from batchtool.check.judge import judge_measured, judge_metadata
from batchtool.check.plan import NEEDS_ROWS, data_rules, not_evaluated, offender_limit, rules_to_check
from batchtool.check.report import FAIL, CheckResult, RuleResult
from batchtool.check.rules import Checksums, Crc, Rule, RuleSet
from batchtool.check.scan import Measures, scan_plan, measure
from batchtool.check.verify import VERIFY_RULES, verify
from batchtool.io.dataset import Dataset
from batchtool.exec.engines import executor as run_executor
from batchtool.core.errors import InputError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor
from batchtool.io.manifest_reader import read_manifest


@dataclass(frozen=True)
class CheckOptions:
    """How to check and report; None means: from the rules file, else the default."""

    key: str | None = None
    """Column whose value is shown with each offending row (default: 'key' if the data has one)."""
    max_offenders: int | None = None
    format: str | None = None
    skip_corrupt: bool = False

    def __post_init__(self) -> None:
        if self.max_offenders is not None and self.max_offenders < 0:
            raise UsageError(f"--max-offenders {self.max_offenders}: must be >= 0")


def check(src: str, rules: RuleSet, options: CheckOptions = CheckOptions(),
          run: RunSettings = RunSettings()) -> CheckResult:
    """Evaluate every rule on SRC. A failing rule is a result (exit 1); bad usage or unreadable input raises.

    run.budget bounds the search for repeated unique keys and duplicate rows (their hashes go to run.tmp_dir), and what one unit
    of input decompresses to; its passes run on the run's executor. With no rule, a batchtool output directory is
    verified against its manifest (MANIFEST_RULES). When the checksum or schema rule fails, rules that then cannot run (a shard is unreadable, a
    column is missing) are reported as not evaluated instead of stopping the check.
    """
    with run_executor(run) as executor:
        return _check(src, rules, options, run, executor)


def _check(src: str, rules: RuleSet, options: CheckOptions, run: RunSettings, executor: Executor) -> CheckResult:
    started = time.perf_counter()
    manifest = read_manifest(src) if fs.is_dir(src) else None
    rules = rules_to_check(rules, manifest)
    limit = offender_limit(options.max_offenders, rules, run.budget)
    results = _judge_files(src, rules, manifest, limit, executor)
    dataset = None
    rows = None
    try:
        crc = any(isinstance(r, Crc) for r in rules.rules)
        dataset = open_checked(src, run, executor, options.skip_corrupt or crc, options.format)
        rows = _judge_data(dataset, rules, options, run, executor, limit, results)
    except InputError as exc:  # unreadable data; usage errors always stop the check
        if not any(r.status == FAIL for r in results.values()):
            raise
        for rule in rules.rules:
            results.setdefault(rule.name, not_evaluated(rule, f"not evaluated: {exc}"))
    return CheckResult(src, dataset.format if dataset else None, rows,
                       tuple(results[r.name] for r in rules.rules), time.perf_counter() - started)


def _judge_files(src: str, rules: RuleSet, manifest: dict | None, limit: int,
                 executor: Executor) -> dict[str, RuleResult]:
    """The checksums and manifest rules: a batchtool output's files against its manifest, before any data is read."""
    verifying = [r for r in rules.rules if isinstance(r, VERIFY_RULES)]
    if verifying and manifest is None:
        raise InputError(f"{verifying[0].label}: {src} is not a batchtool output directory (no manifest "
                         "listing its files)")
    results: dict[str, RuleResult] = {r.name: judge_checksums(r, src, limit, executor)
                                      for r in rules.rules if isinstance(r, Checksums)}
    results.update(verify(verifying, src, manifest, limit, executor))
    return results


def _judge_data(dataset: Dataset, rules: RuleSet, options: CheckOptions, run: RunSettings, executor: Executor,
                limit: int,
                results: dict[str, RuleResult]) -> int | None:
    """Metadata and batch rules first, then one pass for every data rule (drift rules against the baseline's
    profile); returns the row count if known.

    Each result goes into `results` as soon as it is known, so what was judged before the data
    proves unreadable still stands.
    """
    for result in judge_metadata(rules.rules, dataset, limit, executor.threads):
        results[result.name] = result
    baseline = open_baseline(rules.baseline, run, executor, options.skip_corrupt) if rules.drift else None
    runnable: list[Rule] = []
    for outcome in data_rules(rules, dataset, baseline, results):
        if isinstance(outcome, RuleResult):
            results[outcome.name] = outcome
        else:
            runnable.append(outcome)
    measures = _measure(dataset, runnable, rules, options, run, executor, limit)
    for result in judge_measured(runnable, measures, baseline, run, executor, limit):
        results[result.name] = result
    return measures.rows


def _measure(dataset: Dataset, runnable: list[Rule], rules: RuleSet, options: CheckOptions, run: RunSettings,
             executor: Executor, limit: int) -> Measures:
    """The one pass over the columns the runnable rules read; offending rows show the --key column's value."""
    key = options.key or rules.key or ("key" if "key" in dataset.schema.names else None)
    plan = scan_plan(runnable, dataset.schema, key, limit, run.budget)
    return measure(dataset, plan, run, executor, needs_rows=any(isinstance(r, NEEDS_ROWS) for r in runnable))
