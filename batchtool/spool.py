"""Row commands written on a remote engine's workers (--engine ray, DST a path): each read unit's output batches
are made and spooled to a file beside DST where the unit is read, then cut into shards there
(exchange_writer.write_sorted); the driver merges counts, statistics and read reports only.

A spool task reads one unit (batchtool.exchange.read_units), runs the row work on each chunk (an op's kernel and,
for an expanding op, its pieces built, as driver.Applied does; convert's chunk as it is), and writes the batches
write_job would write to one uncompressed Arrow IPC file, renamed into place once complete (so a retried task
replaces, never adds). Batch k of the output is the k-th batch of the spool files read in unit order, so the
shard writer sees exactly the batches write_job sees, and writes the same bytes.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from batchtool import exchange, fs, progress, runner
from batchtool.dataset import Chunk, ReadReport
from batchtool.exchange_writer import write_beside
from batchtool.job import JobResult, RunSettings
from batchtool.ops.base import Bar, Cut, Regrouped, Tally
from batchtool.output import OutputOptions
from batchtool.runner import ordered_map
from batchtool.workspace import Workspace

Emitted = Callable[[Chunk], tuple[Iterable[tuple[list[pa.RecordBatch], int]], Tally]]
"""A chunk's row work, where it is read: what write_job's work gives for it, item by item (output batches and the
input rows each completes), made lazily, and the chunk's statistics."""


def applies(dst: str) -> bool:
    """Whether a row command writing `dst` spools on the workers: a remote engine, and DST a path they share."""
    return runner.active_engine() is not None and not fs.is_uri(dst)


def as_is(chunk: Chunk) -> tuple[Iterable[tuple[list[pa.RecordBatch], int]], Tally]:
    """convert's row work: the chunk, one row group (even empty), as write_job writes it."""
    return [([chunk.data], chunk.num_rows)], Tally()


@dataclass(frozen=True)
class SpoolJob:
    """What every spool task of one command shares."""

    directory: str
    emitted: Emitted
    name: str
    """DST, for errors."""


@dataclass
class Spooled:
    """What a spool task returns to the driver: counts, statistics and what it skipped, never rows."""

    rows: tuple[int, ...] = ()
    """Rows of each batch spooled, in order (plain ints)."""
    consumed: int = 0
    stats: Tally = field(default_factory=Tally)
    report: ReadReport = field(default_factory=ReadReport)


def spool_path(directory: str, index: int) -> str:
    return os.path.join(directory, f"s{index:09d}.arrow")


def _spool(job: SpoolJob, item: tuple[int, exchange.ReadUnit]) -> Spooled:
    """The spool task of unit `index`: its output batches to a file of its own, published once complete."""
    index, unit = item
    fs.check_shared(job.directory, job.name)
    writing = os.path.join(job.directory, f".s{index:09d}-{uuid.uuid4().hex}.arrow")
    out, rows = Spooled(), []
    sink: pa.OSFile | None = None
    writer: pa.ipc.RecordBatchFileWriter | None = None
    try:
        for chunk in unit(out.report):
            items, stats = job.emitted(chunk)
            for batches, consumed in items:
                for batch in batches:
                    if writer is None:
                        sink = pa.OSFile(writing, "wb")
                        writer = pa.ipc.new_file(sink, batch.schema)
                    writer.write_batch(batch)
                    rows.append(batch.num_rows)
                out.consumed += consumed
            out.stats.merge(stats)
        if writer is not None:
            writer.close()
            sink.close()
            os.replace(writing, spool_path(job.directory, index))
    except BaseException:
        if sink is not None:
            sink.close()
        with suppress(OSError):
            os.remove(writing)
        raise
    out.rows = tuple(rows)
    return out


@dataclass(frozen=True)
class SpooledBatches:
    """The spooled output (ops.base.Batches): batch k is the k-th batch of the spool files in unit order."""

    directory: str
    units: tuple[int, ...]
    """The unit of each spool file, in order (units that wrote no batch have none)."""
    per_file: tuple[int, ...]
    """Batches in each spool file."""
    sizes: tuple[int, ...]
    """Rows of each batch."""

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    def batch_rows(self, k: int) -> int:
        return self.sizes[k]

    def first_row(self, k: int) -> int:
        return sum(self.sizes[:k])

    def reader(self, start: int, end: int) -> SpoolReader:
        """Batches [start, end) as a task reading only the spool files holding them."""
        runs, first = [], 0
        for unit, batches in zip(self.units, self.per_file):
            lo, hi = max(start - first, 0), min(end - first, batches)
            if lo < hi:
                runs.append((spool_path(self.directory, unit), lo, hi))
            first += batches
        return SpoolReader(tuple(runs))

    def nbytes(self) -> int:
        return sum(os.path.getsize(spool_path(self.directory, unit)) for unit in self.units)


@dataclass(frozen=True)
class SpoolReader:
    """Runs of batches (path, first, end) read from spool files by memory map, where the task runs."""

    runs: tuple[tuple[str, int, int], ...]

    def __call__(self) -> Iterator[pa.RecordBatch]:
        for path, first, end in self.runs:
            with pa.memory_map(path) as source:
                file = pa.ipc.open_file(source)
                for i in range(first, end):
                    yield file.get_batch(i)


def spool(units: Iterable[exchange.ReadUnit], job: SpoolJob, run: RunSettings, report: ReadReport,
          merge: Callable[[Tally], None], bar: Bar) -> tuple[SpooledBatches, int]:
    """Run the spool tasks on the engine: the spooled batches and the input rows consumed; each task's statistics
    go to `merge` and what it skipped to `report`, in input order."""
    units_, per_file, sizes, consumed = [], [], [], 0
    for index, out in enumerate(ordered_map(functools.partial(_spool, job), enumerate(units), run.threads)):
        if out.rows:
            units_.append(index)
            per_file.append(len(out.rows))
            sizes.extend(out.rows)
        merge(out.stats)
        report.merge(out.report)
        consumed += out.consumed
        bar.update(out.consumed)
    return SpooledBatches(job.directory, tuple(units_), tuple(per_file), tuple(sizes)), consumed


def write_spooled(units: Iterable[exchange.ReadUnit], emitted: Emitted, merge: Callable[[Tally], None],
                  output: OutputOptions, *, stats: Callable[[], dict[str, Any]], total: int | None = None,
                  **job: Any) -> JobResult:
    """write_job's output and manifest, with no row passing through the driver: spool tasks make every unit's
    batches beside DST (in DST's temporary directory), then write_beside writes them as shards on the workers,
    cut where write_job's writer cuts them; `merge` takes each task's statistics in input order. `total`: the
    input rows the bar counts (default the dataset's). `job`: write_beside's arguments."""
    report = job.setdefault("report", ReadReport())

    def produce(space: Workspace) -> tuple[Cut, int]:
        run = job["run"]
        rows = job["dataset"].progress_rows if total is None else total
        with progress.bar(f"{job.get('who') or job['command']}: spool", rows, quiet=run.quiet) as bar:
            batches, rows_in = spool(units, SpoolJob(space.directory, emitted, job["dst"]), run, report, merge, bar)
        return Cut(batches, stats), rows_in

    return write_beside(produce, output, **job)


@dataclass(frozen=True)
class _Item:
    """A regrouping's item as a spool unit: the one thing its task works on."""

    item: Any

    def __call__(self, report: ReadReport) -> Iterator[Any]:
        yield self.item


def _worked(work: Callable[[Any], tuple[list[pa.RecordBatch], int]],
            item: Any) -> tuple[Iterable[tuple[list[pa.RecordBatch], int]], Tally]:
    return [work(item)], Tally()


def write_regrouped_spooled(out: Regrouped, output: OutputOptions, **job: Any) -> JobResult:
    """A regrouping op's output (segment's lane items, pack's rows) written on the workers: each item's work
    (building, padding its batches) spools them where it runs, and the shards are written there, so its output
    never comes back to the driver, only the items go out. `job`: write_beside's arguments."""
    if out.sequence_columns is not None:
        output = replace(output, sequence_columns=out.sequence_columns)
    return write_spooled(map(_Item, out.items), functools.partial(_worked, out.work), Tally().merge, output,
                         stats=out.stats, total=out.total_rows, **job)


__all__ = ["SpoolJob", "Spooled", "SpoolReader", "SpooledBatches", "applies", "as_is", "spool", "spool_path",
           "write_regrouped_spooled", "write_spooled"]
