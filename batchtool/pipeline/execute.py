"""Running a pipeline: first passes stage by stage, then one streaming run into the last stage's writer.

Semantics: a pipeline writes the same bytes as running its stages one by one through the CLI
with the same seed, each reading the previous one's output. A command reading that output sees
example ids (shard, row) of it, so here every stage's input rows are re-keyed to their row number
in the previous stage's output, as shard 0. That is exactly the CLI chain whenever each
intermediate output is one shard (anything under the default 256MB --shard-bytes and 4096 row
groups). Chunks also match: a stage's input chunks are the row groups the previous command
would have written (its non-empty output chunks), and the first one is round-tripped through
Parquet, because operations size their memory from its Arrow bytes.

Passes: stage k's first passes read only the columns it needs (Operation.first_pass), through
the stages before it, whose plans are known by then. Stages without statistics add no pass of
their own; a global shuffle before stage k is spilled (narrowly) only if a stage between them,
or stage k's statistics, depend on ids or order, else it is skipped (it does not change counts
or histograms). The main run then reads every column once: row stages stream, a global shuffle
spills in this thread, and the last stage writes through its operation's own writer.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchtool.exec import exchange
from batchtool.io import manifest as manifest_mod
from batchtool.core import progress, rng
from batchtool.io import stats as stats_mod
from batchtool.io.dataset import Chunk, Dataset, Part, ReadReport
from batchtool.exec.engines import executor as run_executor
from batchtool.core.errors import BatchtoolError, DestinationExistsError
from batchtool.io.formats import parquet as parquet_format
from batchtool.io.inputs import open_dataset
from batchtool.exec.held import pool_for
from batchtool.core.run_settings import RunSettings
from batchtool.exec.job import JobResult, open_mixed, read_paths
from batchtool.io.workspace import Workspace, tasks_executor, workspace
from batchtool.exec.produced import Job, Produced
from batchtool.exec.write import RUN_BYTES, sized_runs, write
from batchtool.exec.driver import EngineRuntime, Ready, produced, regrouped, scanner, stream_errors
from batchtool.ops.regroup import Regrouped, SortedBatches
from batchtool.io.output import destination_taken, refuse_overlap
from batchtool.core.runner import SERIAL, Executor
from batchtool.pipeline import config as config_mod
from batchtool.pipeline.stages import ANY, CHUNKS, ORDER, ChunkStream, Columns, Stage


@dataclass
class PipelineResult:
    """What a run did: per-stage rows (and the manifest), or for a dry run what it would do."""

    stages: list[dict[str, Any]]
    manifest: dict[str, Any] | None = None
    wall_seconds: float = 0.0
    peak_rss_bytes: int = 0


def run_pipeline(config: config_mod.PipelineConfig, run: RunSettings, *, dry_run: bool = False) -> PipelineResult:
    """Plan every stage (its first passes), then run the pipeline into config.output_path (unless dry_run), under the
    file's memory and tmp-dir, on the run's executor."""
    started = time.perf_counter()
    run = replace(run, memory=config.memory, tmp_dir=config.tmp_dir)
    if not dry_run:
        _check_destination(config)
    with ExitStack() as stack:
        executor = stack.enter_context(run_executor(run))
        source, columns = _open_input(config, run, executor)
        refuse_overlap(read_paths(source), {f"{config.path}: [output] path": config.output_path,
                                            f"{config.path}: tmp-dir": config.tmp_dir})
        stages = [Stage(c, config.seed) for c in config.stages]
        prefix = Prefix(config, source, columns, stages, run, executor, stack)
        for k, stage in enumerate(stages):
            with attributed(config.path, stage):
                first = stage.first_pass(prefix.schemas[k])
                wanted = first.columns if first is not None else []
                view = prefix.view(k, wanted, needs=first.depends if first is not None else ANY,
                                   desc=f"{stage.name}: first pass" if first is not None and first.desc is None
                                   else None)
                stage.plan(view, run, prefix.executor)
        if dry_run:
            return PipelineResult(prefix.expected(), wall_seconds=round(time.perf_counter() - started, 3),
                                  peak_rss_bytes=manifest_mod.peak_rss_bytes())
        last = stages[-1]
        with attributed(config.path, last):
            result = prefix.write(started)
    run_section = result.manifest["run"]
    return PipelineResult(result.manifest["stats"]["stages"], result.manifest, run_section["wall_seconds"],
                          run_section["peak_rss_bytes"])


def _open_input(config: config_mod.PipelineConfig, run: RunSettings,
                executor: Executor) -> tuple[Dataset, list[str] | None]:
    """The input and the columns to read of it: one SRC, or the sources of the first stage's mix as one dataset
    (its columns already the ones [input] keeps, and the source column)."""
    given = config.input
    if given.sources is None:
        source = open_dataset(given.path, format=given.format, skip_corrupt=given.skip_corrupt,
                              max_record_bytes=run.max_record_bytes, memory=run.memory, executor=executor)
        return source, source.check_columns(given.columns)
    mix = config.stages[0].options
    return open_mixed(given.sources, mix.names, mix.column, run, executor, format=given.format,
                      skip_corrupt=given.skip_corrupt, columns=given.columns), None


def _check_destination(config: config_mod.PipelineConfig) -> None:
    if not config.output.overwrite and destination_taken(config.output_path):
        raise DestinationExistsError(f"{config.path}: [output] path {config.output_path} exists (set overwrite = true "
                                     "in [output], or pass --overwrite)")


@contextmanager
def attributed(path: str, stage: Stage) -> Iterator[None]:
    """Errors raised by a stage name the pipeline file and the stage, with the stage's keys for its flags."""
    try:
        yield
    except BatchtoolError as exc:
        raise _attribute(exc, f"{path}: {stage.name}: ") from None


def _attribute(exc: BatchtoolError, prefix: str) -> BatchtoolError:
    if not getattr(exc, "pipeline_stage", False):
        exc.args = (prefix + exc.rendered("toml"), *exc.args[1:])
        exc.pipeline_stage = True  # type: ignore[attr-defined]
    return exc


def _attributed_stream(stream: ChunkStream, path: str, stage: Stage) -> ChunkStream:
    with attributed(path, stage):
        yield from stream


@dataclass(frozen=True)
class StageInput(Dataset):
    """The data as stage `stage` (0-based) receives it, as a Dataset: operations run on it unchanged.

    Its tasks run the stages before it; `scope` limits the columns they carry (None: all), and `needs` says
    what its reader depends on (stages.ANY allows skipping a global shuffle before it, for statistics that
    ignore order; stages.CHUNKS makes a narrow shuffle cut its output as the full one does).
    Ids are re-keyed row numbers (see the module docstring); stage 0 reads the source itself.
    """

    prefix: Prefix | None = None
    """The run it belongs to; not pickled (a remote worker only needs `locate`)."""
    source: Dataset | None = None
    stage: int = 0
    scope: tuple[str, ...] | None = None
    needs: int = CHUNKS
    desc: str | None = None

    def tasks(self, columns: Sequence[str] | None = None,
              report: ReadReport | None = None) -> Iterator[Callable[[], Chunk]]:
        cols = self.check_columns(columns if columns is not None else self.scope)  # default: the view's columns
        if self.scope is not None and not set(cols or self.schema.names) <= set(self.scope):
            raise AssertionError(f"columns {cols} outside the scope {self.scope} of this view")
        report = report if report is not None else ReadReport()
        prefix = self._prefix
        if self.stage == 0 and self.desc is None:
            return prefix.source.tasks(cols if cols is not None else prefix.columns, report)
        scope = None if self.scope is None else list(self.scope)
        cut = prefix.sorted_before(self.stage, scope, self.needs) if self.desc is None else None
        if cut is not None:
            return (_SortedBatch(cut.reader(b, b + 1), b, cut.first_row(b), self.scope, None if cols is None else tuple(cols))
                    for b in range(cut.count))
        chunks = prefix.stream(self.stage, scope, report, self.needs)
        if cols is not None and tuple(cols) != self.scope:
            chunks = (Chunk(c.data.select(cols), c.ids) for c in chunks)
        if self.desc:
            chunks = prefix.counted(chunks, self.desc, self.num_rows)
        return map(Ready, chunks)

    def chunks(self, columns: Sequence[str] | None = None, executor: Executor = SERIAL,
               report: ReadReport | None = None) -> Iterator[Chunk]:
        """Past the source, the chunks the stages before made on the executor, as they come: not sent to a worker
        and back for nothing (what reading them as tasks would do); read tasks (the source's, or batches of a
        reorder sorted on the workers) run on the executor."""
        if self.desc is None and (self.stage == 0 or self._prefix.sorted_before(
                self.stage, None if self.scope is None else list(self.scope), self.needs) is not None):
            return super().chunks(columns, executor, report)
        return (task() for task in self.tasks(columns, report))

    def parts(self, columns: Sequence[str] | None = None) -> list[Part]:
        """Stage 0's input is the source, read as it reads itself (a mix: each source by its own format); past it,
        this dataset."""
        if self.stage != 0 or self.desc is not None:
            return super().parts(columns)
        cols = self.check_columns(columns if columns is not None else self.scope)
        return self._prefix.source.parts(cols if cols is not None else self._prefix.columns)

    def locate(self, example_id: int) -> str:
        if self.source is not None:
            return self.source.locate(example_id)
        return f"{self.src}, row {int(example_id)}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "prefix": None}

    @property
    def _prefix(self) -> Prefix:
        assert self.prefix is not None, "a StageInput is made by Prefix.view"
        return self.prefix


@dataclass(frozen=True)
class _SortedBatch:
    """A read task of the stage after a reorder sorted on the workers: batch `index` read from the sorted files
    where the task runs, as Prefix.stream would hand it over (its `scope` columns, re-keyed, the first one
    round-tripped through Parquet), then only the `columns` asked for."""

    read: Callable[[], Iterator[pa.RecordBatch]]
    index: int
    first_row: int
    scope: tuple[str, ...] | None
    columns: tuple[str, ...] | None

    def __call__(self) -> Chunk:
        data = next(iter(self.read()))
        if self.scope is not None:
            data = data.select(list(self.scope))
        if self.index == 0:
            data = reread(data)
        if self.columns is not None and self.columns != self.scope:
            data = data.select(list(self.columns))
        return Chunk(data, rng.example_ids(0, self.first_row, data.num_rows))


class Prefix:
    """The stages of one run and what is known about the data between them."""

    def __init__(self, config: config_mod.PipelineConfig, source: Dataset, columns: list[str] | None, stages: list[Stage],
                 run: RunSettings, executor: Executor, stack: ExitStack) -> None:
        self.config, self.source, self.columns, self.stages, self.run = config, source, columns, stages, run
        self.pool = pool_for(run.budget, executor)
        """What the run's exchanges may hold in memory instead of files (batchtool.exec.held), shared by all of them."""
        self.executor = executor
        """What runs the stages' tasks: the run's, or the driver's threads once a barrier's workspace is on the
        driver's own disk (the workers cannot read its sorted batches there)."""
        self._stack = stack
        self.schemas = [source.projected_schema(columns)]
        for stage in stages:
            with attributed(config.path, stage):
                self.schemas.append(stage.output_schema(self.schemas[-1]))
        self.rows: dict[int, int] = {} if source.num_rows is None else {0: source.num_rows}
        """Rows reaching stage k (k = len(stages): the output), once a complete pass has counted them."""
        self.report = ReadReport()
        """Corrupt records skipped while spilling a global shuffle of the main run."""
        self._barriers: dict[tuple[int, tuple[str, ...] | None, bool], Regrouped] = {}

    def view(self, k: int, scope: Columns, needs: int = CHUNKS, desc: str | None = None) -> StageInput:
        """Stage k's input. Global shuffles before it are spilled now, in this thread, so temporary files
        are only ever written by the thread that removes them (also on Ctrl-C)."""
        if scope is None or scope:
            self._materialize(k, scope, needs)
        src = self.source
        return StageInput(src=src.src if k == 0 else f"{self.config.path}: {self.stages[k].name} input",
                          spec=src.spec, shards=src.shards, schema=self.schemas[k],
                          options=src.options, num_rows=self.rows.get(k), skip_corrupt=src.skip_corrupt,
                          prefix=self, source=src if k == 0 else None, stage=k, scope=None if scope is None else tuple(scope), needs=needs,
                          desc=desc)

    def _materialize(self, k: int, scope: Columns, needs: int) -> None:
        columns = scope
        for j in reversed(range(k)):
            stage = self.stages[j]
            needed = stage.input_columns(columns)
            if stage.barrier and needs >= ORDER:
                key = self._barrier_key(j, needed, needs)
                if key not in self._barriers:
                    like = None
                    if needed is not None and needs >= CHUNKS:  # cut as the full regrouping will be
                        first = next(iter(self.view(j, None).tasks(None)), None)  # read here, not on the engine
                        like = None if first is None else first()
                    upstream = self.view(j, needed)
                    if needed is not None:  # a narrow regrouping reads (and keeps) only these columns
                        upstream = replace(upstream, schema=upstream.projected_schema(needed))
                    with attributed(self.config.path, stage):
                        self._barriers[key] = self._regroup(j, stage, upstream, like)
                return
            needs = max(needs, stage.sensitivity)
            columns = needed

    def _regroup(self, j: int, stage: Stage, upstream: StageInput, like: Chunk | None) -> Regrouped:
        """Barrier j's output, open until the run ends: its exchange in a workspace of its own (beside the output on a
        remote engine, where the stage after it reads its batches), the first chunk measured on `like` when the pass
        is narrow; a barrier with no exchange (the buffered shuffle) regroups as it streams."""
        report = self.report if upstream.scope is None else ReadReport()
        columns = self.columns if upstream.scope is None else list(upstream.scope)
        units = (exchange.read_units(self.source, report, columns) if j == 0
                 else exchange.task_units(upstream.tasks(None, report)))
        space = self._stack.enter_context(workspace(self.config.output_path, self.executor, self.run.tmp_dir))
        self.executor = tasks_executor(space, self.executor)
        runtime = EngineRuntime(upstream, self.executor, space, self.run.shown, stage.name, self.pool)
        cut = self._stack.enter_context(regrouped(stage.op, stage.planned, runtime, units, report, like))
        if isinstance(cut, Regrouped):
            return cut
        batches = cut.batches
        items = [batches.reader(start, end) for start, end in sized_runs(batches, RUN_BYTES)]
        return SortedRegrouped(items, _read_batches, cut.stats, total_rows=batches.rows, batches=batches)

    @staticmethod
    def _barrier_key(j: int, columns: Columns, needs: int) -> tuple[int, tuple[str, ...] | None, bool]:
        return j, _key(columns), columns is not None and needs >= CHUNKS

    def sorted_before(self, k: int, scope: Columns, needs: int) -> SortedBatches | None:
        """The batches reaching stage k, if a reorder sorted on the workers makes them (the stage before it is
        one): its reader then reads them itself, where it runs, instead of through the driver. The reorder's
        statistics and rows are known once sorted, so they are recorded here."""
        if k == 0:
            return None
        stage = self.stages[k - 1]
        needed = stage.input_columns(scope)
        if not (stage.barrier and needs >= ORDER):
            return None
        out = self._barriers[self._barrier_key(k - 1, needed, needs)]
        if not isinstance(out, SortedRegrouped) or out.batches is None:
            return None
        stage.report = out.stats()
        self.rows[k - 1], self.rows[k] = stage.report.get("rows_in", out.batches.rows), out.batches.rows
        return out.batches

    def stream(self, k: int, scope: Columns, report: ReadReport, needs: int) -> Iterator[Chunk]:
        """Chunks reaching stage k (only the `scope` columns), re-keyed; barriers must be spilled already."""
        if k == 0:
            return self.source.chunks(scope if scope is not None else self.columns, self.executor, report)
        stage = self.stages[k - 1]
        needed = stage.input_columns(scope)
        if stage.barrier and needs >= ORDER:
            pairs: ChunkStream = self._regrouped(stage, self._barriers[self._barrier_key(k - 1, needed, needs)])
        elif stage.skippable:  # nothing after it cares about order: skip the shuffle
            pairs = ((c, c.num_rows) for c in self.stream(k - 1, needed, report, ANY))
        else:
            view = self.view(k - 1, needed, max(needs, stage.sensitivity))
            pairs = _attributed_stream(stage.stream(view, needed, self.executor, report), self.config.path, stage)
        return self._rekey(k, pairs, scope)

    def _regrouped(self, stage: Stage, out: Regrouped) -> ChunkStream:
        """A barrier's output chunks: its items through its work, on the executor (ids are re-keyed after), each with
        the input rows it consumed."""
        emitted = 0
        for batches, consumed in self.executor.map(out.work, out.items):
            chunks = [Chunk(b, rng.example_ids(0, 0, b.num_rows)) for b in batches] or [Chunk.concat([], pa.schema([]))]
            for i, chunk in enumerate(chunks):
                yield chunk, consumed if i == len(chunks) - 1 else 0
            emitted += consumed
        stage.report = out.stats()
        unselected = stage.report.get("rows_in", emitted) - emitted
        if unselected:  # a reorder that selects (mix) read the rows it dropped too
            yield Chunk.concat([], pa.schema([])), unselected

    def _rekey(self, k: int, pairs: ChunkStream, scope: Columns) -> Iterator[Chunk]:
        """Ids = row number in the previous stage's output; empty chunks dropped (no row group is written
        for them); the first chunk as a command would read it back from Parquet."""
        rows = read = 0
        for chunk, consumed in pairs:
            read += consumed
            if not chunk.num_rows:
                continue
            data = chunk.data if scope is None else chunk.data.select(scope)
            if not rows:
                data = reread(data)
            yield Chunk(data, rng.example_ids(0, rows, data.num_rows))
            rows += data.num_rows
        self.rows[k - 1], self.rows[k] = read, rows

    def counted(self, chunks: Iterator[Chunk], desc: str, total: int | None) -> Iterator[Chunk]:
        """One progress bar per pass (rows reaching the stage)."""
        with progress.bar(desc, total, self.run.shown) as bar:
            for chunk in chunks:
                bar.update(chunk.num_rows)
                yield chunk

    def write(self, started: float) -> JobResult:
        """The last stage as its command runs (driver.produced, batchtool.exec.write): its tasks read the source, or the
        batches a reorder before it sorted, or the rows the stages before it make; the manifest records the
        pipeline."""
        k = len(self.stages) - 1
        stage = self.stages[k]
        view = self.view(k, None)
        units = (exchange.units(self.source, self.report, self.executor, self.columns) if k == 0
                 else exchange.task_units(view.tasks(None, self.report)))
        job = Job("run", self.config.manifest_options(), self.config.seed, self.source, self.config.output_path,
                  self.config.output, stage.output_schema(view.schema), self.run, stage.name, started, self.stats,
                  batches=self.config.stages[k].batching, numbered=k == 0)

        def produce(space: Workspace, report: ReadReport) -> AbstractContextManager[Produced]:
            runtime = EngineRuntime.of(view, space, self.executor, self.run.shown, stage.name, self.pool)
            return produced(stage.op, stage.planned, stage.regroups, runtime, report, units)

        with stream_errors(view, self.executor):
            return write(job, produce, self.executor, self.report)

    def stats(self, last: dict[str, Any], rows_out: int) -> dict[str, Any]:
        """manifest["stats"]: rows in and out of every stage with its own statistics, plus the totals."""
        stages = []
        for k, stage in enumerate(self.stages):
            is_last = k == len(self.stages) - 1
            own = last if is_last else stage.report
            rows_in = self.rows.get(k, own.get("rows_in"))
            stages.append({"stage": k + 1, "op": stage.op.name, **own, "rows_in": rows_in,
                           "rows_out": rows_out if is_last else self.rows.get(k + 1)})
        out: dict[str, Any] = {"rows_in": stages[0]["rows_in"], "stages": stages}
        for key in ("batches", "padding_efficiency"):
            if key in last:
                out[key] = last[key]
        return out

    def expected(self) -> list[dict[str, Any]]:
        """Dry run: per stage, the rows in (counted by the first passes, or planned) and what it would make (the
        last stage may scan its input for it, which counts its rows too)."""
        last = len(self.stages) - 1
        stage, schema = self.stages[last], self.schemas[last]
        scanned: list[Columns] = []

        def scan(columns: list[str], fn: Callable[[Chunk], Any]) -> Iterator[Any]:
            scanned.append(columns)
            with attributed(self.config.path, stage):
                view = self.view(last, columns, needs=ANY, desc=f"{stage.name}: dry run")
                return scanner(view, self.executor)(columns, fn)

        with attributed(self.config.path, stage):
            last_expected = stage.expected(self.rows.get(last), scan)
        if last not in self.rows:  # count the rows reaching the last stage (one narrow pass)
            column = next((f.name for f in schema if not pa.types.is_nested(f.type)), schema.names[0])
            stats_mod.collect(self.view(last, [column], needs=ANY, desc=f"{stage.name}: dry-run count"),
                              executor=self.executor)
            if not scanned:
                last_expected = stage.expected(self.rows.get(last), scan)
        out, planned = [], self.rows.get(0)
        for k, stage in enumerate(self.stages):
            rows_in = self.rows.get(k, planned)
            rows_out, info = last_expected if k == last else stage.expected(rows_in, scan)
            planned = self.rows.get(k + 1, rows_out)
            out.append({"stage": k + 1, "op": stage.op.name, "rows_in": info.pop("rows_in", rows_in),  # an op that
                        "rows_out": planned if k < last else rows_out, **info})  # counted its input says so
        return out


@dataclass
class SortedRegrouped(Regrouped):
    """A barrier's batches in sorted files every worker reads (`batches`): the stage after it reads them itself,
    where its tasks run, instead of through the items."""

    batches: SortedBatches | None = None


def _read_batches(read: Callable[[], Iterator[pa.RecordBatch]]) -> tuple[list[pa.RecordBatch], int]:
    """A barrier's item on a worker: its batches read from the sorted files, and the rows they hold."""
    batches = list(read())
    return batches, sum(b.num_rows for b in batches)


def _key(columns: Columns) -> tuple[str, ...] | None:
    return None if columns is None else tuple(columns)


def reread(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch as a command reads it back from a batch shard: same values, Parquet-decoded buffers."""
    sink = io.BytesIO()
    writer = parquet_format.ParquetShardWriter(sink, batch.schema, compression="none")
    writer.write(batch)
    writer.close()
    return parquet_format.decode_row_group(pq.ParquetFile(io.BytesIO(sink.getvalue())), 0, None)


__all__ = ["PipelineResult", "StageInput", "reread", "run_pipeline"]
