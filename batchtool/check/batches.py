"""Batch-level rules for batch outputs (bucket, segment, balanced stratify), on the batches `batchtool.load` yields.

Padding per bucket comes from the manifest bucket wrote; rows per batch from Parquet footers
(files that do not index their batches: the `batch` column); quotas and ranks read one small column batch by batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.check.report import Offender, RuleResult, plural, skipped, verdict
from batchtool.check.rules import BatchQuotas, BatchRows, MaxBatchCost, PaddingEfficiency, RankBatches, Rule
from batchtool.check.recorded import Recorded, recorded_stat
from batchtool.io.dataset import Dataset
from batchtool.core.errors import InputError, UsageError
from batchtool.loader.load import load
from batchtool.io.manifest import manifest_path
from batchtool.ops.quotas import QuotaLayout

BATCH_RULES = (BatchRows, BatchQuotas, RankBatches, MaxBatchCost)


def judge_batches(rule: Rule, dataset: Dataset, limit: int, threads: int) -> RuleResult:
    """The result of one batch rule (`BATCH_RULES`, or padding_efficiency with per_bucket)."""
    if isinstance(rule, PaddingEfficiency):
        return judge_bucket_padding(rule, dataset, limit)
    if isinstance(rule, MaxBatchCost):
        return judge_batch_cost(rule, dataset, limit)
    if isinstance(rule, BatchRows):
        return judge_batch_rows(rule, dataset, limit, threads)
    if isinstance(rule, BatchQuotas):
        return judge_batch_quotas(rule, dataset, limit, threads)
    return judge_rank_batches(rule, dataset, limit, threads)


def _batches(rule: Rule, dataset: Dataset, columns: list[str], threads: int) -> Iterator[pa.RecordBatch]:
    """SRC's batches in file order (how `batchtool.load(..., shuffle=False)` yields them), with only `columns`.

    A rule asked of data whose batches cannot be told apart is a usage error (exit 2), never a failure.
    """
    if not dataset.spec.self_indexing and dataset.manifest is None:
        raise UsageError(f"{rule.label}: {dataset.src} is {dataset.spec.label} without a batchtool manifest, "
                         f"so its {dataset.spec.unit}s mark no batches")
    return load(dataset.src, columns=columns, shuffle=False, threads=threads).record_batches()


def _bucket_name(b: Recorded) -> str:
    """A bucket of a bucket manifest as a report names it: `bucket 2 (lengths 10-19)`, or for two lengths
    `cell 1,0 (lengths 10-19 x 0-7)`."""
    def span(edges: tuple[int, int | None]) -> str:
        return f"{edges[0]}-{'' if edges[1] is None else edges[1] - 1}"

    if b.has("cell"):
        cell, ranges = b.counts("cell") or [], b.ranges("lengths") or []
        return f"cell {','.join(map(str, cell))} (lengths {' x '.join(map(span, ranges))})"
    edges = b.range("lengths")
    return f"bucket {b.count('bucket')}" + (f" (lengths {span(edges)})" if edges else "")


def judge_batch_cost(rule: MaxBatchCost, dataset: Dataset, limit: int) -> RuleResult:
    """Each cell's largest batch cost, as a two-length bucket output recorded it, against `max`."""
    cells = recorded_stat(rule.label, dataset, "max_batch_cost", "bucket with two --length",
                          UsageError)[0].objects("buckets") or []
    costs = [(_bucket_name(b), b.number("max_batch_cost") or 0.0, b.count("batches") or 0) for b in cells]
    bound = f"<= {rule.max:g} in every batch"
    if not any(batches for _, _, batches in costs):
        return verdict(rule, True, "no batches", bound)
    worst = max(costs, key=lambda c: c[1])
    high = [c for c in costs if c[1] > rule.max]
    offenders = [Offender(f"{name}: largest batch cost {cost:g} ({plural(batches, 'batch', 'batches')})")
                 for name, cost, batches in high[:limit]]
    return verdict(rule, not high, f"largest {worst[1]:g} ({worst[0]})", bound, worst[1], len(high), offenders)


def judge_bucket_padding(rule: PaddingEfficiency, dataset: Dataset, limit: int) -> RuleResult:
    """Each bucket's real / padded elements, as bucket recorded them; empty buckets have none."""
    def described(b: Recorded) -> tuple[str, float | None, int]:
        return _bucket_name(b), b.share("padding_efficiency"), b.count("batches") or 0

    recorded = recorded_stat(rule.label, dataset, "buckets", "bucket", UsageError)[0].objects("buckets") or []
    buckets = [b for b in map(described, recorded) if b[1] is not None]
    bound = f">= {rule.min:g} in every bucket"
    if not buckets:
        return verdict(rule, False, "no bucket holds examples", bound)
    worst = min(buckets, key=lambda b: b[1])
    low = [b for b in buckets if b[1] < rule.min]
    offenders = [Offender(f"{name}: {efficiency:.4f} ({plural(batches, 'batch', 'batches')})")
                 for name, efficiency, batches in low[:limit]]
    return verdict(rule, not low, f"worst {worst[0]}: {worst[1]:.4f}", bound, worst[1], len(low), offenders)


def judge_batch_rows(rule: BatchRows, dataset: Dataset, limit: int, threads: int) -> RuleResult:
    bound = (f"[{rule.min:,}, {rule.max:,}]" if rule.min is not None and rule.max is not None
             else f">= {rule.min:,}" if rule.min is not None else f"<= {rule.max:,}") + " rows per batch"
    batches = low = high = bad = 0
    offenders = []
    for i, batch in enumerate(_batches(rule, dataset, [], threads)):
        n = batch.num_rows
        low, high = (n, n) if not i else (min(low, n), max(high, n))
        batches += 1
        if (rule.min is not None and n < rule.min) or (rule.max is not None and n > rule.max):
            bad += 1
            if len(offenders) < limit:
                offenders.append(Offender(f"batch {i}: {plural(n, 'row')}"))
    if not batches:
        return verdict(rule, True, "no batches", bound)
    span = f"{low:,} rows in each of" if low == high else f"{low:,}-{high:,} rows in"
    return verdict(rule, not bad, f"{span} {plural(batches, 'batch', 'batches')}", bound, {"min": low, "max": high},
                   bad, offenders)


def judge_batch_quotas(rule: BatchQuotas, dataset: Dataset, limit: int, threads: int) -> RuleResult:
    """Batch i must hold exactly the quotas stratify gave batch i (QuotaLayout, rebuilt from the manifest and
    unrolled along with the batches, so no manifest value decides how much is held in memory)."""
    stats = recorded_stat(rule.label, dataset, "balanced_batches", "stratify --balanced-batches",
                          UsageError)[0]
    expected, partial = stats.count("balanced_batches"), stats.counts("final_batch_quotas")
    target, size, label = stats.shares("target"), stats.count("batch_size"), stats.text("label")
    missing = [k for k, v in (("final_batch_quotas", partial), ("target", target), ("batch_size", size),
                              ("label", label)) if v is None]
    if missing:
        raise InputError(f"{rule.label}: {stats.path} lacks the balanced-batch layout (no stats.{missing[0]})")
    if partial and len(partial) != len(target) or not size or expected < bool(sum(partial)):
        raise InputError(f"{rule.label}: {stats.path}: the balanced-batch layout does not add up "
                         f"({len(target)} classes, final batch quotas {partial}, batch size {size}, "
                         f"{expected} batches)")
    layout = QuotaLayout(tuple(target), size, expected - bool(sum(partial)), tuple(partial))
    quotas = layout.sequence()
    classes = len(layout.target)
    bad = seen = 0
    offenders = []
    for i, batch in enumerate(_batches(rule, dataset, [label], threads)):
        labels = pc.fill_null(batch.column(0), -1).to_numpy(zero_copy_only=False)
        outside = (labels < 0) | (labels >= classes)
        counts = np.bincount(labels[~outside].astype(np.int64), minlength=classes)
        want = next(quotas, None)
        seen = i + 1
        if outside.any() or want is None or not np.array_equal(counts, want):
            bad += 1
            detail = (f"{plural(int(outside.sum()), 'label')} null or outside [0, {classes})" if outside.any()
                      else "no batch (beyond the layout's)" if want is None else f"quotas {want.tolist()}")
            if len(offenders) < limit:
                offenders.append(Offender(f"batch {i}: classes {counts.tolist()}, expected {detail}"))
    if seen < expected:
        bad += 1
        if len(offenders) < limit:
            offenders.append(Offender(f"{plural(seen, 'batch', 'batches')}, the layout has {expected:,}"))
    measured = (f"every batch of {expected:,} holds its quotas" if not bad
                else f"{bad:,} of {plural(max(seen, expected), 'batch', 'batches')} off their quotas")
    return verdict(rule, not bad, measured, f"{label} quotas of stratify --balanced-batches, batch by batch",
                   bad, bad, offenders)


def judge_rank_batches(rule: RankBatches, dataset: Dataset, limit: int, threads: int) -> RuleResult:
    """Batches per rank from the manifest's per-rank files, else from a rank column; skipped without either."""
    manifest = dataset.manifest
    files = Recorded(manifest_path(dataset.src), manifest["output"], "output").objects("files") or [] \
        if manifest else []
    ranks = [f.count("rank") for f in files]
    counts: Counter[int] = Counter()
    mixed = 0
    problems = []
    if files and all(r is not None for r in ranks):
        for f, r in zip(files, ranks):
            counts[r] += f.count("batches") or 0
        source = "manifest"
    elif rule.column in dataset.schema.names:
        for i, batch in enumerate(_batches(rule, dataset, [rule.column], threads)):
            ranks = np.unique(batch.column(0).drop_null().to_numpy(zero_copy_only=False))
            if len(ranks) != 1:
                mixed += 1
                if len(problems) < limit:
                    problems.append(Offender(f"batch {i}: ranks {ranks.tolist()}, expected one"))
            counts.update(int(r) for r in ranks)
        source = f"column {rule.column!r}"
    else:
        return skipped(rule, f"no rank layout: no {rule.column!r} column and no per-rank files in the manifest")
    if not counts:
        return verdict(rule, True, "no batches", "equal batches per rank")
    most = max(counts.values())
    behind = [Offender(f"rank {r}: {plural(n, 'batch', 'batches')}, rank {max(counts, key=counts.get)} has {most:,}")
              for r, n in sorted(counts.items()) if n != most]
    low, high = min(counts.values()), most
    measured = (f"{plural(len(counts), 'rank')}, {plural(high, 'batch', 'batches')} each" if low == high
                else f"{plural(len(counts), 'rank')}, {low:,}-{high:,} batches") + f" (from the {source})"
    per_rank = {str(r): n for r, n in sorted(counts.items())}
    offending = mixed + len(behind)
    return verdict(rule, not offending, measured, "equal batches per rank", per_rank, offending,
                   (problems + behind)[:limit])
