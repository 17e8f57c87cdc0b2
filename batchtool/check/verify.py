"""`check DST` with no rule: a batchtool output verified against its manifest (rows, batches, schema per file).

Checksums are the `checksums` rule's (evaluate.judge_checksums); this module adds what the
writer recorded beyond the bytes: each file's rows (Parquet footers, TFRecord records counted),
batches (Parquet row groups, TFRecord runs of the `batch` column) and schema. Every file is read
once, on worker threads, for all three rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from batchtool import fs
from batchtool.check.report import Offender, RuleResult, every, plural, skipped, verdict
from batchtool.check.rules import ManifestBatches, ManifestRows, ManifestSchema, Rule
from batchtool.dataset import _schema_diff, detect_format
from batchtool.errors import BatchtoolError, InputError
from batchtool.formats import arrow as arrow_format
from batchtool.formats import example as example_codec
from batchtool.formats import parquet as parquet_format
from batchtool.formats import tfrecord as tfrecord_format
from batchtool.load import BATCH_COLUMN
from batchtool.manifest import OutputFile, output_files, schema_from_json
from batchtool.runner import ordered_map

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
class Layout:
    """How to read the files: their format, the manifest's schema and TFRecord payload kind, and whether to
    count TFRecord batches (which decodes every record's batch column)."""

    format: str
    schema: pa.Schema
    tfrecord_kind: str
    count_batches: bool = True


def output_stats(manifest: dict) -> dict:
    """The stats that describe the output: the command's, or for `run` those of its last stage (whose batches,
    buckets and classes are what DST holds)."""
    stats = manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {}
    stages = stats.get("stages")
    if manifest.get("command") == "run" and isinstance(stages, list) and stages and isinstance(stages[-1], dict):
        return {**stats, **stages[-1]}
    return stats


def verify(rules: Sequence[Rule], src: str, manifest: dict, limit: int, threads: int) -> dict[str, RuleResult]:
    """Results of the manifest_rows, manifest_batches and manifest_schema rules, from one read of each file."""
    if not rules:
        return {}
    files = output_files(src, manifest)
    output = manifest["output"]
    schema = schema_from_json(manifest["schema"])
    layout = Layout(output.get("format") or (detect_format(files[0].name) if files else None) or "parquet", schema,
                    output.get("tfrecord_kind") or "sequence_example",
                    any(isinstance(r, ManifestBatches) for r in rules))
    found = list(ordered_map(lambda f: inspect_file(f.path, layout), files, threads))
    results = {}
    for rule in rules:
        if isinstance(rule, ManifestRows):
            results[rule.name] = _counts(rule, files, found, "rows", "row", output.get("rows"), limit)
        elif isinstance(rule, ManifestBatches):
            if all(f.batches is None and f.error is None for f in found):
                results[rule.name] = skipped(rule, f"TFRecord records without a {BATCH_COLUMN!r} column mark "
                                                   "no batches")
            else:
                results[rule.name] = _counts(rule, files, found, "batches", "batch", output.get("batches"), limit)
        else:
            results[rule.name] = _schema(rule, files, found, schema, limit)
    return results


def inspect_file(path: str, layout: Layout) -> Found:
    """Rows, batches and schema of one file, reading only what that takes (a Parquet footer, Arrow batch
    headers; TFRecord records)."""
    if not fs.is_file(path):
        return Found(error="missing")
    try:
        if layout.format == "parquet":
            pf = parquet_format.open_file(path)
            meta = pf.metadata
            groups = sum(1 for rg in range(meta.num_row_groups) if meta.row_group(rg).num_rows)
            return Found(meta.num_rows, groups, _schema_problem(pf.schema_arrow, layout))
        if layout.format == "arrow":
            rows = arrow_format.batch_rows(path)
            schema = arrow_format.open_file(path).schema
            return Found(sum(rows), sum(1 for r in rows if r), _schema_problem(schema, layout))
        return _inspect_tfrecord(path, layout)
    except (BatchtoolError, OSError, pa.ArrowException) as exc:
        return Found(error=f"unreadable: {exc}")


def _schema_problem(schema: pa.Schema, layout: Layout) -> str | None:
    schema = schema.remove_metadata()
    return None if schema.equals(layout.schema.remove_metadata()) else _schema_diff(layout.schema, schema)


def _inspect_tfrecord(path: str, layout: Layout) -> Found:
    """Count records and runs of the batch column; the first chunk must decode to the manifest's schema and
    hold no feature it lacks (a TFRecord file records no schema of its own)."""
    batch_schema = (pa.schema([layout.schema.field(BATCH_COLUMN)])
                    if layout.count_batches and BATCH_COLUMN in layout.schema.names else None)
    rows = batches = 0
    previous = None
    problem = None
    for first, payloads in tfrecord_format.iter_record_chunks(path, tfrecord_format.CHUNK_RECORDS):
        if first == 0:
            problem = _tfrecord_schema_problem(payloads, path, layout)
        rows += len(payloads)
        if batch_schema is not None:
            ids = example_codec.decode_records(payloads, batch_schema, layout.tfrecord_kind, path=path,
                                               first_record=first).column(0).to_numpy(zero_copy_only=False)
            starts = np.r_[previous is None or ids[0] != previous, ids[1:] != ids[:-1]] if len(ids) else []
            batches += int(np.count_nonzero(starts))
            previous = ids[-1] if len(ids) else previous
    return Found(rows, batches if batch_schema is not None else None, problem)


def _tfrecord_schema_problem(payloads: list[bytes], path: str, layout: Layout) -> str | None:
    try:
        example_codec.decode_records(payloads, layout.schema, layout.tfrecord_kind, path=path, first_record=0)
    except InputError as exc:
        return str(exc)
    inferred, _ = example_codec.infer_schema(payloads, layout.tfrecord_kind, path=path)
    extra = [n for n in inferred.names if n not in layout.schema.names]
    return f"features not in the manifest's schema: {', '.join(extra)}" if extra else None


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
