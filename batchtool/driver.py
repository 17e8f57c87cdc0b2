"""Running an operation definition (ops/base.py): its first pass, then its kernel over every chunk on the
engine with the statistics merged in input order; a command writes the result, a pipeline stage streams it on."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.base import Operation, OptionError, Stats, add_stats
from batchtool.ops.shuffle import manifest_options
from batchtool.output import OutputOptions
from batchtool.runner import ordered_map


def _first_pass(op: Operation, options: Any, task: Callable[[], Chunk]) -> Stats:
    return op.first_pass(options, task())


def _kernel(op: Operation, plan: Any, task: Callable[[], Chunk]) -> tuple[Chunk, Stats, int]:
    chunk = task()
    out, stats = op.kernel(plan, chunk)
    return out, stats, chunk.num_rows


def make_plan(op: Operation, options: Any, dataset: Dataset, threads: int) -> Any:
    """The op's plan: its first pass over the columns it names (if any), merged in input order."""
    columns = op.first_pass_columns(options)
    stats: Stats | None = None
    if columns:
        stats = {}
        for part in ordered_map(functools.partial(_first_pass, op, options), dataset.tasks(columns), threads):
            stats = add_stats(stats, part)
    return op.plan(options, dataset.schema, stats)


class Applied:
    """An op's kernel over a stream of read tasks: the output chunks in order, each with the input rows it
    consumed; the kernels' statistics merged as the results arrive, in input order."""

    def __init__(self, op: Operation, plan: Any) -> None:
        self.op, self.plan = op, plan
        self.stats: Stats = {}

    def run(self, tasks: Iterable[Callable[[], Chunk]], threads: int) -> Iterator[tuple[Chunk, int]]:
        for out, stats, rows in ordered_map(functools.partial(_kernel, self.op, self.plan), tasks, threads):
            self.stats = add_stats(self.stats, stats)
            yield out, rows

    def report(self) -> dict[str, Any]:
        return self.op.report(self.plan, self.stats)


def emit_nonempty(item: tuple[Chunk, int]) -> tuple[list[pa.RecordBatch], int]:
    """One row group per non-empty output chunk, as `convert` writes."""
    chunk, rows = item
    return ([chunk.data] if chunk.num_rows else []), rows


@with_engine
def run_operation(op: Operation, options: Any, src: str, dst: str, output: OutputOptions,
                  run: RunSettings = RunSettings(), *, format: str | None = None,
                  skip_corrupt: bool = False) -> JobResult:
    """An op as a command: SRC through its plan and kernel into DST, with the manifest."""
    dataset = open_source(src, dst, output, format=format, skip_corrupt=skip_corrupt)
    try:
        schema = op.output_schema(options, dataset.schema)
    except OptionError as exc:
        raise exc.at(dataset.src) from None
    applied = Applied(op, make_plan(op, options, dataset, run.threads))
    report = ReadReport()
    items = applied.run(dataset.tasks(op.input_columns(options, None), report), run.threads)
    return write_job(command=op.name, options=manifest_options(options, output), seed=None, dataset=dataset,
                     dst=dst, output=output, schema=schema, items=items, work=emit_nonempty, stats=applied.report,
                     run=run, report=report)


__all__ = ["Applied", "emit_nonempty", "make_plan", "run_operation"]
