"""`check DST` with no rule: a batchtool output verified against its manifest (rows, batches, schema per file).

Checksums are the `checksums` rule's (checksums.py); this module adds what the
writer recorded beyond the bytes: each file's rows, batches and schema, as its format finds them
(BatchIndex.inspect_shard: footers, or records and runs of the `batch` column). Every file
is read once, on worker threads, for all three rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from batchtool.core import fs
from batchtool.io.formats import registry
from batchtool.check.report import Offender, RuleResult, every, plural, skipped, verdict
from batchtool.check.rules import ManifestBatches, ManifestRows, ManifestSchema, Rule
from batchtool.core.errors import BatchtoolError
from batchtool.io.formats.base import BATCH_COLUMN
from batchtool.io.inputs import detect_format
from batchtool.io.manifest import OutputFile, manifest_path, output_files, schema_from_json
from batchtool.ops.written import written_names
from batchtool.core.runner import Executor

VERIFY_RULES = (ManifestRows, ManifestBatches, ManifestSchema)


@dataclass(frozen=True)
class Found:
    """What one file holds: its rows, batches (None: not recorded in the file) and schema problem, or why it
    could not be read."""

    rows: int | None = None
    batches: int | None = None
    schema_problem: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class OutputReading:
    """How to read the files: their format, the manifest's schema and output section, and the column whose runs mark
    the batches where counting them means decoding every record (a format that does not index its own batches;
    None: batches are not counted)."""

    format: str
    schema: pa.Schema
    output: dict
    batch_column: str | None


def verify(rules: Sequence[Rule], src: str, manifest: dict, limit: int,
           executor: Executor) -> dict[str, RuleResult]:
    """Results of the manifest_rows, manifest_batches and manifest_schema rules, from one read of each file."""
    if not rules:
        return {}
    files = output_files(src, manifest)
    output = manifest["output"]
    schema = schema_from_json(manifest["schema"])
    batch_column = written_names(manifest, manifest_path(src)).get("batch", BATCH_COLUMN)
    fmt = output.get("format") or (detect_format(files[0].name) if files else None) or registry.DEFAULT
    layout = OutputReading(fmt, schema, output,
                           batch_column if any(isinstance(r, ManifestBatches) for r in rules) else None)
    found = list(executor.map(lambda f: inspect_file(f.path, layout), files))
    results = {}
    for rule in rules:
        if isinstance(rule, ManifestRows):
            results[rule.name] = _counts(rule, files, found, "rows", "row", output.get("rows"), limit)
        elif isinstance(rule, ManifestBatches):
            if all(f.batches is None and f.error is None for f in found):
                spec = registry.get(layout.format)
                results[rule.name] = skipped(rule, f"{spec.label} {spec.unit}s without a {batch_column!r} column "
                                                   "mark no batches")
            else:
                results[rule.name] = _counts(rule, files, found, "batches", "batch", output.get("batches"), limit)
        else:
            results[rule.name] = _schema(rule, files, found, schema, limit)
    return results


def inspect_file(path: str, layout: OutputReading) -> Found:
    """Rows, batches and schema of one file, reading only what its format needs for them."""
    if not fs.is_file(path):
        return Found(error="missing")
    try:
        return Found(*registry.get(layout.format).inspect_shard(path, layout.schema, layout.output,
                                                                layout.batch_column))
    except (BatchtoolError, OSError, pa.ArrowException) as exc:
        return Found(error=f"unreadable: {exc}")


def _counts(rule: Rule, files: list[OutputFile], found: list[Found], field: str, word: str, total: object,
            limit: int) -> RuleResult:
    """Each file's rows (or batches) against the manifest's, and the manifest's total against its files."""
    words = "batches" if word == "batch" else None
    problems = []
    for f, got in zip(files, found):
        want = getattr(f, field)
        have = getattr(got, field)
        if got.error:
            problems.append(Offender(got.error, f.path))
        elif have is not None and have != want:
            problems.append(Offender(f"{plural(have, word, words)}, the manifest says {want:,}", f.path))
    n, bad = len(files), len(problems)
    listed = sum(getattr(f, field) for f in files)
    if total != listed:
        problems.append(Offender(f"the manifest's output.{field} is {total}, its files add up to {listed:,}"))
    parts = (["the only file differs" if n == 1 else f"{bad} of {n:,} files differ"] if bad else []) \
        + (["the manifest's total differs"] if total != listed else [])
    measured = "; ".join(parts) or f"{plural(listed, word, words)} in {plural(n, 'file')}, as listed"
    return verdict(rule, not problems, measured, f"{words or word + 's'} per file as in the manifest",
                   len(problems), len(problems), problems[:limit])


def _schema(rule: Rule, files: list[OutputFile], found: list[Found], schema: pa.Schema, limit: int) -> RuleResult:
    problems = [Offender(got.error or got.schema_problem, f.path) for f, got in zip(files, found)
                if got.error or got.schema_problem]
    n = len(files)
    measured = (f"{every(n, 'file')} {'has' if n == 1 else 'have'} the manifest's {plural(len(schema), 'column')}"
                if not problems else problems[0].detail if n == 1 else f"{len(problems)} of {n} files differ")
    return verdict(rule, not problems, measured, "schema as in the manifest", len(problems), len(problems),
                   problems[:limit])
