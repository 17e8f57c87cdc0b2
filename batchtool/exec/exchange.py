"""Global reorders as map-reduce on the engine's workers: the data goes from input to output through the run's
workspace, never through the driver, which passes paths and counts only.

A map task reads one unit of input (a Parquet row group, a whole file of records: see read_units) and
scatters its rows, exactly as the local spill does (batchtool.io.spill.Spill), to (group, part) cells: the part is
the range of each row's keyed order key. A reduce task reads one (group, part) from every map, in map order, and
sorts it by the key (spill.sort_part): since the rows come in input order and the sort is stable, that is the very
order the local spill reads back, so the output bytes are the same on any engine. The cells are files in
`<exchange>/m<unit number>/` and the sorted ranges files in `<exchange>/sorted/`, on storage every worker shares;
on the local engine, whose threads share the driver's memory, they are held in memory instead while the run's
pool allows (batchtool.exec.held), which changes where the rows lie, never which rows or their order.
"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from batchtool.core import fs
from batchtool.io.dataset import Chunk, Dataset, OneChunk, ReadReport
from batchtool.ops.base import Operation
from batchtool.ops.regroup import Exchange, Input, Stream, Bar, Cut, Runtime, Scatter, Scattered
from batchtool.core.runner import Executor
from batchtool.exec.held import HeldCells, Pool
from batchtool.io.spill import ID_COLUMN, Spill, SpillFiles, read_file, sort_part
from batchtool.io.workspace import Workspace

T = TypeVar("T")



class ReadUnit(Protocol):
    """Input a worker reads whole: its chunks, in order; what it skips (--skip-corrupt) goes to `report`."""

    def __call__(self, report: ReadReport) -> Iterator[Chunk]: ...


def read_units(dataset: Dataset, report: ReadReport, columns: Sequence[str] | None = None) -> Iterator[ReadUnit]:
    """The dataset's input as units for workers, in order, as its format cuts it (Reader.units: its read tasks, or
    files a worker reads whole from their start); `report` gets what the driver's own passes skip. A mix's
    sources (Dataset.parts) each as its own format reads it."""
    for part in dataset.parts(columns):
        for unit in part.dataset.spec.units(part.dataset, part.columns, report):
            yield unit if part.adapt is None else _Adapted(unit, part.adapt)


@dataclass(frozen=True)
class _Adapted:
    """A unit of a mix's source whose chunks become the mix's (Part.adapt) where the unit is read."""

    unit: ReadUnit
    adapt: Callable[[Chunk], Chunk]

    def __call__(self, report: ReadReport) -> Iterator[Chunk]:
        return map(self.adapt, self.unit(report))


def units(dataset: Dataset, report: ReadReport, executor: Executor,
          columns: Sequence[str] | None = None) -> Iterator[ReadUnit]:
    """What the writer's tasks read of the input: where one writer on the driver appends the batches (workers that
    share its memory) a unit per read task (the writer waits for each task's output in turn, so a task must be a
    chunk, never a whole file); else its read units, whose output each task spools where it reads them."""
    if executor.shares.memory:
        return task_units(dataset.tasks(dataset.check_columns(columns), report))
    return read_units(dataset, report, columns)


def task_units(tasks: Iterable[Callable[[], Chunk]]) -> Iterator[ReadUnit]:
    """Read tasks that are already worker-sized (a Parquet row group, an Arrow record batch, a chunk the stages
    before a pipeline's reorder made) as units."""
    for task in tasks:
        yield OneChunk(task)


def _measure_first(measure: Callable[[Chunk], T | None], unit: ReadUnit) -> T | None:
    return next((found for found in map(measure, unit(ReadReport())) if found is not None), None)


def first_measured(units: Iterator[ReadUnit], measure: Callable[[Chunk], T | None],
                   executor: Executor) -> tuple[T | None, Iterator[ReadUnit]]:
    """`measure` of the first chunk it is not None for (the yardstick of the first pass: the first chunk, or
    an op's first non-empty output), computed on a worker, and the units with the ones probed put back."""
    probed: list[ReadUnit] = []
    for unit in units:
        probed.append(unit)
        found = next(iter(executor.map(functools.partial(_measure_first, measure), [unit])))
        if found is not None:
            return found, itertools.chain(probed, units)
    return None, iter(probed)


@dataclass(frozen=True)
class MapJob:
    """What every map task of one exchange shares."""

    space: Workspace
    scatter: Scatter
    pool: Pool | None = None
    """What the tasks may hold in memory instead of writing files (batchtool.exec.held); None: files only (workers
    that do not share the driver's memory)."""

    @property
    def directory(self) -> str:
        return self.space.directory

    def errors(self) -> AbstractContextManager[None]:
        return self.space.errors()


@dataclass
class MapOutput:
    """What a map task returns to the driver: counts and the op's statistics, never rows."""

    rows: tuple[tuple[int, ...], ...]
    """Rows per part of each group (plain ints: nothing of a map's result travels as an out-of-band buffer)."""
    report: ReadReport = field(default_factory=ReadReport)
    stats: list[Any] = field(default_factory=list)
    """Scatter.prepare's statistics, one per chunk read."""
    held: HeldCells | None = None
    """Its cells, when the pool held them all (then it wrote no file); None: in the workspace's m<index>/."""


def _map(job: MapJob, item: tuple[int, ReadUnit]) -> MapOutput:
    """The map task: unit number `index` read, prepared (Scatter.prepare) and scattered (_scatter_into)."""
    index, unit = item
    out = MapOutput(())
    prepare = job.scatter.prepare

    def prepared() -> Iterator[tuple[Chunk, np.ndarray]]:
        for chunk in unit(out.report):
            if prepare is None:
                yield chunk, np.zeros(chunk.num_rows, dtype=np.int64)
                continue
            rows, groups, stats = prepare(chunk)
            out.stats.append(stats)
            yield rows, groups

    out.rows, out.held = _scatter_into(job, index, prepared())
    return out


def _scatter_into(job: MapJob, index: int, prepared: Iterable[tuple[Chunk, np.ndarray]]
                  ) -> tuple[tuple[tuple[int, ...], ...], HeldCells | None]:
    """Rows with their groups scattered to cells in memory while the job's pool allows (batchtool.exec.held), else to a
    directory of map `index`'s own, published as m<index> once complete (replacing what a failed earlier attempt
    of the task left); the rows in each part of each group (plain ints: nothing of a map's result travels as an
    out-of-band buffer), and the cells if all were held. Directories are made with mkdir, never makedirs: a task
    still running after a failed command's cleanup must not recreate its tree."""
    writing = os.path.join(job.directory, f".m{index:09d}-{uuid.uuid4().hex}")

    def files(schema: pa.Schema) -> SpillFiles:
        fs.check_shared(job.directory, job.space.name)
        with job.errors():
            os.mkdir(writing)
        return SpillFiles(writing, schema, job.errors)

    plan = job.scatter
    spill = Spill(plan.schema, plan.parts, plan.seed, plan.stage, flush_bytes=plan.flush_bytes,
                  cells=files if job.pool is None else functools.partial(HeldCells, job.pool, files))
    try:
        for chunk, groups in prepared:
            if chunk.num_rows:
                spill.add(chunk, groups)
        spill.finish()
        held = spill.cells if isinstance(spill.cells, HeldCells) and spill.cells.files is None else None
        if held is None:
            own = map_directory(job.directory, index)
            fs.remove_tree(own)
            with job.errors():
                os.rename(writing, own)
    except BaseException:
        spill.close()
        raise
    rows = tuple(tuple(spill.part_rows.get((g, p), 0) for p in range(parts)) for g, parts in enumerate(plan.parts))
    return rows, held


def map_directory(directory: str, index: int) -> str:
    return os.path.join(directory, f"m{index:09d}")


def scatter_here(prepared: Iterable[tuple[Chunk, np.ndarray, Any]], job: MapJob,
                 bar: Bar) -> tuple[list[np.ndarray], list[Any], dict[int, HeldCells]]:
    """The map side of an exchange whose groups depend on the rows before (Exchange.rows): its rows, groups and
    statistics made in input order are scattered here, as one map task would scatter them."""
    stats: list[Any] = []

    def counted() -> Iterator[tuple[Chunk, np.ndarray]]:
        for chunk, groups, chunk_stats in prepared:
            stats.append(chunk_stats)
            bar.update(chunk.num_rows)
            yield chunk, groups

    rows, held = _scatter_into(job, 0, counted())
    return [np.asarray(counts, dtype=np.int64) for counts in rows], stats, {} if held is None else {0: held}


def scatter(units: Iterable[ReadUnit], job: MapJob, executor: Executor, report: ReadReport,
            bar: Bar) -> tuple[list[np.ndarray], list[Any], dict[int, HeldCells]]:
    """Run the map tasks on the engine; the rows in each part of each group, Scatter.prepare's statistics in input
    order (what the tasks skipped goes to `report`, in input order), and the cells of the maps held in memory."""
    rows = [np.zeros(parts, dtype=np.int64) for parts in job.scatter.parts]
    stats: list[Any] = []
    held: dict[int, HeldCells] = {}
    for index, out in enumerate(executor.map(functools.partial(_map, job), enumerate(units))):
        if out.held is not None:
            held[index] = out.held
        for group, counts in zip(rows, out.rows):
            group += np.asarray(counts, dtype=np.int64)
        report.merge(out.report)
        stats.extend(out.stats)
        bar.update(sum(map(sum, out.rows)))
    return rows, stats, held


def read_range(directory: str, plan: Scatter, group: int, part: int,
               held: Mapping[int, HeldCells] | None = None) -> Chunk | None:
    """The reduce side: one (group, part) of every map, in map order (from its files in m<index>/, or from
    memory for the maps in `held`), sorted as the plan says (None if empty)."""
    paths = sorted(glob.glob(os.path.join(glob.escape(directory), "m*", f"g{group:06d}-p{part:06d}-f*.arrow")))
    files: dict[int, list[str]] = {}
    for path in paths:
        files.setdefault(int(os.path.basename(os.path.dirname(path))[1:]), []).append(path)
    held = held or {}
    tables = [table for index in sorted(files.keys() | held.keys())
              for table in (held[index].tables(group, part) if index in held else map(read_file, files[index]))]
    chunk = sort_part(tables, plan.seed, plan.stage, ordered=plan.keyed)
    if chunk is None or plan.order is None:
        return chunk
    return chunk.take(plan.order(chunk.data))


@dataclass(frozen=True)
class HeldPart:
    """A sorted key range the pool let the local engine keep in memory, and the bytes its file would have."""

    chunk: Chunk
    file_bytes: int


@dataclass(frozen=True)
class SortedGroup:
    """A group's rows in key order, one part at a time: held in memory (on the local engine, within its pool),
    else one uncompressed Arrow IPC file per part (sort_groups wrote them), which any worker reads by memory map.
    Either way the same chunks: a part's rows as one chunk, without sorting again."""

    directory: str
    group: int
    part_rows: tuple[int, ...]
    held: tuple[HeldPart | None, ...] = ()
    """Each part's rows if held in memory (empty: none is)."""

    def path(self, part: int) -> str:
        return os.path.join(self.directory, "sorted", f"g{self.group:06d}-p{part:06d}.arrow")

    def _held(self, part: int) -> HeldPart | None:
        return self.held[part] if self.held else None

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """The parts' chunks from the one holding row `start` on (as Spill.read_group yields them, so slicing
        them as a local run does gives batches laid out the same); the caller skips start - first_row(...)."""
        first = 0
        for part, rows in enumerate(self.part_rows):
            if rows and first + rows > start:
                held = self._held(part)
                if held is not None:
                    yield held.chunk
                else:
                    with pa.memory_map(self.path(part)) as source:
                        table = pa.ipc.open_file(source).read_all()
                    last = table.num_columns - 1
                    yield Chunk(table.remove_column(last).combine_chunks().to_batches()[0],
                                table.column(last).to_numpy())
            first += rows

    def nbytes(self) -> int:
        """The sorted files' bytes (uncompressed Arrow; a held part's as if written): the size of the data before
        any output encoding, which sizes the writer's runs (and a pipeline's chunks after it) alike either way."""
        return sum(held.file_bytes if (held := self._held(p)) is not None else os.path.getsize(self.path(p))
                   for p, rows in enumerate(self.part_rows) if rows)

    def first_row(self, start: int) -> int:
        """The first row of the part holding row `start` (where chunks(start) begins)."""
        first = 0
        for rows in self.part_rows:
            if rows and first + rows > start:
                return first
            first += rows
        return first


def _write_sorted(sink: pa.NativeFile, data: pa.RecordBatch) -> None:
    with pa.ipc.new_file(sink, data.schema) as writer:
        writer.write_batch(data)


def _sort_part(job: MapJob, held: Mapping[int, HeldCells], cell: tuple[int, int, str]) -> HeldPart | None:
    """The reduce task of one key range: read it from every map, sort it, and hold it if the pool allows (the
    maps' copies given back first), else write it for SortedGroup."""
    group, part, path = cell
    chunk = read_range(job.directory, job.scatter, group, part, held)
    for cells in held.values():
        cells.drop(group, part)
    if chunk is None:
        return None
    data = chunk.data.append_column(ID_COLUMN, pa.array(chunk.ids, pa.uint64()))
    if job.pool is not None and job.pool.take(data.nbytes):
        size = pa.MockOutputStream()
        _write_sorted(size, data)
        return HeldPart(chunk, size.size())
    with job.errors():
        with suppress(FileExistsError):
            os.mkdir(os.path.dirname(path))
        with pa.OSFile(path, "wb") as sink:
            _write_sorted(sink, data)
    return None


def sort_groups(job: MapJob, rows: Sequence[np.ndarray], executor: Executor,
                held: Mapping[int, HeldCells] | None = None) -> list[SortedGroup]:
    """Sort every key range of every group on the engine's workers, one task per range that holds rows; `held`:
    the map outputs in memory, by map number."""
    counts = [tuple(int(n) for n in part_rows) for part_rows in rows]
    cells = [(g, part, SortedGroup(job.directory, g, ()).path(part))
             for g, part_rows in enumerate(counts) for part, n in enumerate(part_rows) if n]
    sorted_parts = dict(zip(((g, part) for g, part, _ in cells),
                            executor.map(functools.partial(_sort_part, job, held or {}), cells)))
    kept = [tuple(sorted_parts.get((g, part)) for part in range(len(part_rows))) for g, part_rows in enumerate(counts)]
    return [SortedGroup(job.directory, g, part_rows, parts if any(parts) else ())
            for g, (part_rows, parts) in enumerate(zip(counts, kept))]


def regrouping(op: Operation, plan: Any, data: Dataset, units: Iterator[ReadUnit], executor: Executor,
               like: Chunk | None = None) -> tuple[Exchange | Stream, Iterator[ReadUnit]]:
    """The op's regrouping (Operation.regroup) of `data`, told what is known before a row is read
    (ops.regroup.Input), and the units with any it probed put back. Its probe measures the input's first chunk, read
    on a worker, or `like` when given (a pipeline's narrow pass, cut as the full input is); in order, read here."""
    def probe(measure: Callable[[Chunk], Any], in_order: bool = False) -> Any:
        nonlocal units
        if in_order:
            return next((found for found in map(measure, data.chunks()) if found is not None), None)
        if like is not None:
            return measure(like)
        found, units = first_measured(units, measure, executor)
        return found

    gzip = any(s.path.lower().endswith((".gz", ".gzip")) for s in data.shards)
    told = Input(data.schema, data.locate, data.num_rows, data.progress_rows, data.total_bytes, gzip)
    return op.regroup(plan, told, probe), units


def exchanged(reorder: Exchange, units: Iterable[ReadUnit], data: Dataset, runtime: Runtime,
              report: ReadReport, pool: Pool | None = None) -> Cut:
    """An exchange run on the runtime's engine: map tasks scatter every row to its key range, in memory while the
    run's `pool` allows (the local engine), else in the runtime's workspace (or, for an op whose groups depend on
    the rows before, the driver does, Exchange.rows), a task sorts each range, and the op cuts the sorted rows into
    batches."""
    job = MapJob(runtime.space, reorder.scatter, pool)
    with runtime.bar("spill", None if reorder.rows is not None else data.progress_rows) as bar:
        if reorder.rows is not None:
            rows, stats, held = scatter_here(reorder.rows(runtime, report), job, bar)
        else:
            rows, stats, held = scatter(units, job, runtime.executor, report, bar)
    groups = sort_groups(job, rows, runtime.executor, held)
    totals = np.array([int(r.sum()) for r in rows], dtype=np.int64)
    return reorder.cut(Scattered(reorder.scatter.schema, list(groups), totals, stats), runtime)


__all__ = ["HeldPart", "MapJob", "MapOutput", "exchanged", "regrouping", "first_measured", "units",
           "ReadUnit", "SortedGroup", "map_directory", "read_range", "read_units", "scatter", "sort_groups",
           "task_units"]
