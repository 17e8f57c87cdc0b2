"""stratify's writing pass, outside ops/ (which does no I/O): opens SRC, runs the passes, and writes one row
group per input chunk, batches of --batch-size, or balanced batches spilled by class; for the command and
for a pipeline whose last stage it is."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from batchtool import budget, progress
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.base import manifest_options
from batchtool.driver import Applied, make_plan, scanner
from batchtool.ops.labels import LabelError, check_label_type, full_label_error
from batchtool.ops.quotas import plan_layout
from batchtool.ops.keyed import PART_SHARE, keyed_spill, spill_streams
from batchtool.ops.rows import RowReader, bytes_per_row, emit, estimate_memory_bytes, peek, rebatch
from batchtool.ops.stratify import OP, STAGE, Stratification, StratifyOptions, balanced_batches
from batchtool.output import OutputOptions
from batchtool.spill import parts_for


@with_engine
def stratify(src: str, dst: str, options: StratifyOptions, output: OutputOptions, run: RunSettings = RunSettings(),
             *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """Stratify SRC into DST. Exact mode: a counting pass, one or two threshold passes over the label
    column, then one parallel filtering pass that writes."""
    dataset = open_source(src, dst, output, tmp_dir=options.tmp_dir, format=format, skip_corrupt=skip_corrupt)
    return write_stratified(dataset, resolve(dataset, options, seed, run.threads), dst, output, run, seed=seed)


def write_stratified(dataset: Dataset, strat: Stratification, dst: str, output: OutputOptions, run: RunSettings,
                     *, seed: int, write: Callable[..., JobResult] = write_job, who: str = "stratify") -> JobResult:
    """The pass that writes (`write` is write_job, or a wrapper when stratify is a pipeline's last stage,
    whose name `who` then labels the progress bars)."""
    with labels_counted(dataset, strat, run.threads):
        return _write(Applied(OP, strat), dataset, dst, output, run, write, who)


def resolve(dataset: Dataset, options: StratifyOptions, seed: int, threads: int) -> Stratification:
    """stratify's plan, from its first pass (class counts) and, in exact mode, its threshold passes."""
    check_label_type(dataset, options.label)
    return make_plan(OP, options, dataset, threads, seed)


@contextlib.contextmanager
def labels_counted(dataset: Dataset, strat: Stratification, threads: int) -> Iterator[None]:
    """A bad label found while streaming (no counting pass: --init-probs, --mode online) becomes the error
    over the whole dataset: every bad label counted, the first one named."""
    try:
        yield
    except LabelError:
        raise full_label_error(scanner(dataset, threads), strat.options.label, strat.num_classes,
                               dataset.locate) from None



def _write(applied: Applied, dataset: Dataset, dst: str, output: OutputOptions, run: RunSettings,
           write: Callable[..., JobResult], who: str) -> JobResult:
    """Write the selection: one row group per input chunk, batches of --batch-size, or balanced batches."""
    strat: Stratification = applied.plan
    options, report, expected_rows = strat.options, ReadReport(), strat.expected_rows
    common = dict(command="stratify", options=manifest_options(options, output), seed=strat.seed, dataset=dataset,
                  dst=dst, output=output, schema=dataset.schema, run=run, report=report, stats=applied.report)
    if options.batch_size is None:
        return write(**common, items=applied.items(dataset, None, run.threads, report), work=applied.emit,
                     total_rows=dataset.progress_rows)
    selected = (c for c, _ in applied.stream(dataset, None, run.threads, report) if c.num_rows)
    first, selected = peek(selected)
    most_rows = int(expected_rows) if options.mode == "exact" else None if options.replacement else dataset.num_rows
    budget.check_rows("--batch-size", options.batch_size, most_rows, bytes_per_row(first), options.memory)
    if not options.balanced_batches:
        batches = rebatch(selected, options.batch_size, dataset.schema, options.drop_remainder)
        return write(**common, items=_counted(applied, batches), work=emit,
                     total_rows=int(expected_rows) if expected_rows is not None else None)
    active = strat.target > 0
    whole = estimate_memory_bytes(dataset, first, rows=int(expected_rows) if expected_rows is not None else None)
    part_bytes = max(1, options.memory // (PART_SHARE * int(active.sum())))
    parts = [parts_for(whole * t, part_bytes) for t in strat.target.tolist()]
    with keyed_spill(dataset.schema, parts, strat.seed, STAGE + "/order", options.memory, options.tmp_dir) as spill:
        with progress.bar(f"{who}: select", dataset.progress_rows, quiet=run.quiet) as bar:
            spill_streams(selected, spill, strat.labels, bar)
        available = spill.rows.copy()
        layout = plan_layout(available, strat.target, options.batch_size, partial=not options.drop_remainder,
                             oversample=False)
        streams = [RowReader(spill.read_group(c), dataset.schema) for c in range(strat.num_classes)]
        applied.stats.latest["batches"] = {"batch_size": options.batch_size,
                                           "balanced_batches": layout.batches + bool(sum(layout.partial)),
                                           "final_batch_quotas": list(layout.partial)}
        return write(**common, items=_counted(applied, balanced_batches(streams, layout, strat.seed, dataset.schema)),
                     work=emit, total_rows=int(layout.per_class.sum()))


def _counted(applied: Applied, batches: Iterable[Chunk]) -> Iterator[Chunk]:
    """The batches as they go to the writer, their classes counted here (on the driver, in order)."""
    strat: Stratification = applied.plan
    for chunk in batches:
        applied.stats.add(class_out=np.bincount(strat.labels(chunk), minlength=strat.num_classes))
        yield chunk


__all__ = ["labels_counted", "resolve", "stratify", "write_stratified"]
