"""Running an operation definition (ops/base.py): its first pass, then its kernel over every chunk on the
engine with the statistics merged in input order; a command writes the result, a pipeline stage streams it on."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa

from batchtool.core import progress
from batchtool.exec import exchange
from batchtool.exec.distinct import KeyPairs, key_pairs
from batchtool.core.progress import HIDDEN, Shown
from batchtool.io.dataset import Chunk, Dataset, ReadReport, first_in_input
from batchtool.exec.engines import executor as run_executor
from batchtool.core.errors import BatchtoolError, PartialError, RowError
from batchtool.exec.exchange import ReadUnit
from batchtool.exec.held import Pool, pool_for
from batchtool.core.run_settings import RunSettings
from batchtool.exec.job import JobResult, open_source, open_sources
from batchtool.exec.produced import Deferred, Emitted, Item, Job, Produced, Streamed
from batchtool.exec.write import write
from batchtool.ops.base import Expanding, Piece, Context, Kind, Operation, OptionError, Scan
from batchtool.ops.regroup import Bar, Cut, Exchange, Regrouped, Repeat
from batchtool.core.tally import Tally
from batchtool.io.output import OutputOptions
from batchtool.core.runner import Executor
from batchtool.io.workspace import Workspace, tasks_executor

T = TypeVar("T")


@dataclass(frozen=True)
class EngineRuntime:
    """The ops.regroup.Runtime of a run: its input, whose rows it feeds the op, the executor of its tasks, its
    workspace and its progress bars, named by `who` runs the op (`shuffle`, `stage 1 (shuffle)`)."""

    data: Dataset
    """The op's input (a pipeline stage's: the stages before it run in its read tasks)."""
    executor: Executor
    space: Workspace
    shown: Shown = HIDDEN
    """How its passes show their progress."""
    who: str | None = None
    """Who its bars name before the op's own words (`stage 2 (stratify): select` in a pipeline); None: no one."""
    pool: Pool | None = None
    """What the run's exchanges may hold in memory instead of the workspace's files (batchtool.exec.held)."""

    @classmethod
    def of(cls, data: Dataset, space: Workspace, executor: Executor, shown: Shown, who: str | None,
           pool: Pool | None = None) -> EngineRuntime:
        """The runtime of tasks writing `space`: on the run's executor if its workers share it, else on threads."""
        return cls(data, tasks_executor(space, executor), space, shown, who, pool)

    def bar(self, desc: str, total: int | None) -> AbstractContextManager[Bar]:
        return progress.bar(f"{self.who}: {desc}" if self.who else desc, total, self.shown)

    def rows(self, columns: Sequence[str] | None, report: ReadReport) -> Iterator[Chunk]:
        return self.data.chunks(columns, self.executor, report)

    def map_rows(self, fn: Callable[[int, Chunk], T], columns: Sequence[str] | None,
                 report: ReadReport) -> Iterator[T]:
        return self.executor.map(functools.partial(_numbered, fn), enumerate(self.data.tasks(columns, report)))

    def apply(self, op: Operation, plan: Any, report: ReadReport) -> tuple[Iterator[tuple[Chunk, int]], Tally]:
        applied = Applied(op, plan)
        return applied.stream(self.data, None, self.executor, report), applied.stats

    def distinct(self, budget: int) -> KeyPairs:
        return key_pairs(self.space, budget)

    def repeats(self, keys: KeyPairs, columns: Sequence[str], limit: int) -> tuple[int, list[Repeat]]:
        return keys.repeats(self.data, columns, self.executor, limit)


def _numbered(fn: Callable[[int, Chunk], T], item: tuple[int, Callable[[], Chunk]]) -> T:
    index, task = item
    return fn(index, task())


@dataclass(frozen=True)
class Ready:
    """A read task whose chunk is already in hand: read by the driver (an op planning chunk by chunk needs to see
    it) or made by a pipeline's stages before."""

    chunk: Chunk

    def __call__(self) -> Chunk:
        return self.chunk


def _pass_of(of: Callable[[Context, Chunk], Any], context: Context, task: Callable[[], Chunk]) -> tuple[Any, int]:
    chunk = task()
    return of(context, chunk), chunk.num_rows


def _kernel(op: Operation, item: tuple[Callable[[], Chunk], Any]) -> tuple[Any, Tally, int]:
    task, plan = item
    chunk = task()
    out, stats = op.kernel(plan, chunk)
    return out, stats, chunk.num_rows


def _apply(fn: Callable[[Chunk], Any], task: Callable[[], Chunk]) -> Any:
    return fn(task())


def scanner(dataset: Dataset, executor: Executor) -> Scan:
    """Passes over `dataset` on the executor, each result in input order (Context.scan)."""
    def scan(columns: list[str], fn: Callable[[Chunk], Any]) -> Iterator[Any]:
        return executor.map(functools.partial(_apply, fn), dataset.tasks(columns))
    return scan


def op_plan(op: Operation, options: Any, dataset: Dataset, run: RunSettings, executor: Executor,
              seed: int = 0) -> Any:
    """The op's plan under the run's memory: its first pass (if any) over the columns it names, on the executor,
    merged in input order."""
    context = Context(seed, dataset.schema, dataset.src, dataset.locate,
                      first_file=dataset.shards[0].path if dataset.shards else None, memory=run.budget,
                      tasks=executor.shares.tasks_per_process)
    first = op.first_pass(options, dataset.schema)
    stats: Any = None
    if first is not None:
        desc = f"{op.name}: {first.desc}" if first.desc else None
        with progress.bar(desc, dataset.num_rows, run.shown) if desc else contextlib.nullcontext(_Unshown()) as bar:
            stats = _merged(first.new(), functools.partial(_pass_of, first.of, context), dataset.tasks(first.columns),
                            executor, bar)
    return op.plan(options, replace(context, scan=scanner(dataset, executor)), stats)


def _merged(stats: Any, part: Callable[[Callable[[], Chunk]], tuple[Any, int]], tasks: Iterable[Callable[[], Chunk]],
            executor: Executor, bar: Bar) -> Any:
    """A pass's per-chunk statistics (`part` of each read task, on the executor) merged into `stats` in input
    order."""
    for chunk_stats, rows in executor.map(part, tasks):
        stats.merge(chunk_stats)
        bar.update(rows)
    return stats


class _Unshown:
    """The bar of a first pass the op names none for (no bar at all: a pipeline stage shows its own)."""

    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def stream_errors(dataset: Dataset, executor: Executor) -> Iterator[None]:
    """Around every stream of `dataset` through the op (its kernel or regrouping, as a command or a pipeline
    stage): an error found mid-stream that knows only part of the input becomes the error over the whole input
    (errors.PartialError), one at a row of an output batch the first such row of the input (errors.RowError)."""
    try:
        yield
    except BatchtoolError as exc:
        better = None
        if isinstance(exc, PartialError):
            better = exc.over_input(scanner(dataset, executor), dataset.locate)
        elif isinstance(exc, RowError):
            better = first_in_input(exc, dataset, executor)
        if better is None:
            raise
        raise better from None


class Applied:
    """An op's kernel over a dataset's chunks, on the engine: the output in order, and the kernels' statistics
    merged as the results arrive, in input order."""

    def __init__(self, op: Operation, plan: Any) -> None:
        self.op, self.plan = op, plan
        self.stats = Tally()

    def items(self, dataset: Dataset, columns: Sequence[str] | None, executor: Executor,
              report: ReadReport) -> Iterator[Any]:
        """What the writer's work takes: (chunk, input rows) pairs, or the pieces of an expanding op."""
        per_chunk = self.op.per_chunk(self.plan)
        if per_chunk is None:
            work = ((task, self.plan) for task in dataset.tasks(columns, report))
        else:
            work = ((Ready(chunk), per_chunk(chunk)) for chunk in dataset.chunks(columns, executor, report))
        for out, stats, rows in executor.map(functools.partial(_kernel, self.op), work):
            self.stats.merge(stats)
            if isinstance(out, Expanding):
                yield from out.pieces()
            else:
                yield out, rows

    def stream(self, dataset: Dataset, columns: Sequence[str] | None, executor: Executor,
               report: ReadReport) -> Iterator[tuple[Chunk, int]]:
        """The output chunks in order, each with the input rows it completes."""
        return executor.map(_work, self.items(dataset, columns, executor, report))

    @property
    def emitted(self) -> Emitted:
        """The writer's work on a chunk (or, planning chunk by chunk, a chunk and its plan): its kernel, then each
        item it makes as a piece (an expanding op's built where the writer wants it)."""
        return functools.partial(_emitted, self.op, self.plan)

    def units(self, dataset: Dataset, columns: Sequence[str] | None, executor: Executor,
              report: ReadReport) -> Iterator[ReadUnit]:
        """What the writer's tasks read: the input's units, or, when the plan changes chunk by chunk in input
        order, each chunk read here with its plan."""
        per_chunk = self.op.per_chunk(self.plan)
        if per_chunk is None:
            return exchange.units(dataset, report, executor, columns)
        return (Item((chunk, per_chunk(chunk))) for chunk in dataset.chunks(columns, executor, report))

    def report(self) -> dict[str, Any]:
        return self.op.report(self.plan, self.stats)


def _work(item: tuple[Chunk, int] | Piece) -> tuple[Chunk, int]:
    """An item as an output chunk and the input rows it completes: a chunk as it is, a piece built (on the engine's
    workers)."""
    return item if isinstance(item, tuple) else (item.build(), item.rows)


def _emitted(op: Operation, plan: Any, read: Chunk | tuple[Chunk, Any]) -> tuple[list[Deferred], Tally]:
    chunk, chunk_plan = read if isinstance(read, tuple) else (read, plan)
    out, stats = op.kernel(chunk_plan, chunk)
    if isinstance(out, Expanding):
        return [functools.partial(_built, piece) for piece in out.pieces()], stats
    return [functools.partial(emit_nonempty, (out, chunk.num_rows))], stats


def _built(piece: Piece) -> tuple[list[pa.RecordBatch], int]:
    return emit_nonempty((piece.build(), piece.rows))


def emit_nonempty(item: tuple[Chunk, int]) -> tuple[list[pa.RecordBatch], int]:
    """One row group per non-empty output chunk."""
    chunk, rows = item
    return ([chunk.data] if chunk.num_rows else []), rows


def _item_work(work: Callable[[Any], tuple[list[pa.RecordBatch], int]], item: Any) -> tuple[list[Deferred], Tally]:
    return [functools.partial(work, item)], Tally()


@contextlib.contextmanager
def regrouped(op: Operation, plan: Any, runtime: EngineRuntime, units: Iterator[ReadUnit], report: ReadReport,
              like: Chunk | None = None) -> Iterator[Cut | Regrouped]:
    """The op's regrouping of the runtime's input, open while the block runs: its exchange run on the engine (the
    sorted batches' cut), or its stream's items as the rows are fed to it. `like`: as exchange.regrouping."""
    regrouping, units = exchange.regrouping(op, plan, runtime.data, units, runtime.executor, like)
    if isinstance(regrouping, Exchange):
        yield exchange.exchanged(regrouping, units, runtime.data, runtime, report, runtime.pool)
        return
    with regrouping.open(runtime, report) as out:
        yield out


@contextlib.contextmanager
def produced(op: Operation, plan: Any, regroups: bool, runtime: EngineRuntime, report: ReadReport,
             units: Iterable[ReadUnit] | None = None, columns: Sequence[str] | None = None) -> Iterator[Produced]:
    """What the op makes of the runtime's input for the writer (batchtool.exec.write), open while it writes: a
    regrouping's exchange (its sorted batches, made in the runtime's workspace), else its regrouping's stream of
    items, or its kernel over every chunk. `units`: what its tasks read (default: the input's units; an op
    planning chunk by chunk reads its chunks here)."""
    data = runtime.data
    if regroups:
        with regrouped(op, plan, runtime, exchange.read_units(data, report) if units is None else units,
                       report) as out:
            yield out if isinstance(out, Cut) else Streamed(
                map(Item, out.items), functools.partial(_item_work, out.work), out.stats, total_rows=out.total_rows,
                sequence_columns=out.sequence_columns, stacked_rows=out.stacked_rows)
        return
    applied = Applied(op, plan)
    if units is None or op.per_chunk(plan) is not None:
        units = applied.units(data, columns, runtime.executor, report)
    yield Streamed(units, applied.emitted, applied.report, applied.stats.merge, total_rows=data.progress_rows)


def run_operation(op: Operation, options: Any, src: str, dst: str, output: OutputOptions,
                  run: RunSettings = RunSettings(), *, seed: int = 0, format: str | None = None,
                  skip_corrupt: bool = False) -> JobResult:
    """An op as a command: SRC through its plan and kernel (or its regrouping) into DST, with the manifest, on the
    run's executor."""
    with run_executor(run) as executor:
        dataset = open_source(src, dst, output, run, executor, format=format, skip_corrupt=skip_corrupt)
        return _run_operation(op, options, dataset, dst, output, run, executor, seed)


def run_mixed(op: Operation, options: Any, srcs: Sequence[str], names: Sequence[str], column: str, dst: str,
              output: OutputOptions, run: RunSettings = RunSettings(), *, seed: int = 0, format: str | None = None,
              skip_corrupt: bool = False, columns: Sequence[str] | None = None) -> JobResult:
    """An op of several sources as a command: the SRCs opened as one dataset (`names` for them, each row's source in
    `column`, only `columns` of each), then as run_operation runs one SRC."""
    with run_executor(run) as executor:
        dataset = open_sources(srcs, names, column, dst, output, run, executor, format=format,
                               skip_corrupt=skip_corrupt, columns=columns)
        return _run_operation(op, options, dataset, dst, output, run, executor, seed)


def _run_operation(op: Operation, options: Any, dataset: Dataset, dst: str, output: OutputOptions, run: RunSettings,
                   executor: Executor, seed: int) -> JobResult:
    try:
        schema = op.output_schema(options, dataset.schema)
        recorded = {**op.recorded(options, dataset.schema, output), **run.recorded(op.spills)}
    except OptionError as exc:
        raise exc.at(dataset.src) from None
    plan = op_plan(op, options, dataset, run, executor, seed)
    job = Job(op.name, recorded, seed if op.seeded else None, dataset, dst, output, schema, run,
              batches=op.writes_batches(options))
    regroups = op.shape(options).kind is not Kind.ROWS
    pool = pool_for(run.budget, executor)

    def produce(space: Workspace, report: ReadReport) -> AbstractContextManager[Produced]:
        runtime = EngineRuntime.of(dataset, space, executor, run.shown, op.name, pool)
        return produced(op, plan, regroups, runtime, report, columns=op.input_columns(options, None))

    with stream_errors(dataset, executor):
        return write(job, produce, executor)


__all__ = ["Applied", "EngineRuntime", "Ready", "emit_nonempty", "op_plan", "run_mixed", "run_operation", "scanner",
           "stream_errors",
           "produced", "regrouped"]
