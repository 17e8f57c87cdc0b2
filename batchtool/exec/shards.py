"""Shards written by the workers, for an executor whose workers do not share the driver's memory (runner.Shares):
results would travel to the driver and back, so the tasks that make the batches spool them to the workspace, and
tasks of their own write every shard, cut where the driver's one writer would cut it (output.shard_ends)."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from batchtool.core import fs, progress
from batchtool.core.runner import Executor
from batchtool.core.tally import Tally
from batchtool.exec.exchange import ReadUnit
from batchtool.exec.produced import Emitted, Job, Streamed
from batchtool.io.dataset import ReadReport
from batchtool.io.example_ids import taken
from batchtool.io.example_index import CarriedWriter
from batchtool.io.formats.base import EncodedBatch
from batchtool.io.output import BatchShardWriter, OutputOptions, encode_batches, shard_ends
from batchtool.io.workspace import Workspace
from batchtool.ops.regroup import Cut, SortedBatches, firsts_of

MEASURES_PER_WORKER = 2
"""Sorted batches are measured in this many tasks per worker CPU, so every worker encodes."""


Kept = Callable[[np.ndarray | None], None]
"""Takes each batch's carried example ids, in order (batchtool.io.example_ids; None: a batch carried none)."""


def stored_batches(batches: Iterable[pa.RecordBatch], width: int, kept: Kept | None) -> Iterator[pa.RecordBatch]:
    """Batches as the output stores them (`width` columns): the example ids they carry taken off, to `kept` (None:
    dropped)."""
    for batch in batches:
        data, ids = taken(batch, width)
        if kept is not None:
            kept(ids)
        yield data


@dataclass(frozen=True)
class Encoded:
    """Output batches [start, end) of sorted batches (SortedBatches.reader), encoded for the output."""

    read: Callable[[], Iterator[pa.RecordBatch]]
    output: OutputOptions
    stored: pa.Schema

    def __call__(self, kept: Kept | None = None) -> Iterator[EncodedBatch]:
        """The batches encoded; the example ids they carry to `kept`, in order."""
        yield from encode_batches(stored_batches(self.read(), len(self.stored), kept), self.output)


def runs_of(count: int, step: int) -> list[tuple[int, int]]:
    """[start, end) runs of `step` batches each (the last one shorter) over `count` batches."""
    return [(k, min(k + step, count)) for k in range(0, count, step)]



@dataclass(frozen=True)
class _SpoolJob:
    """What every spool task of one run shares."""

    directory: str
    emitted: Emitted
    name: str
    """DST, for errors."""


@dataclass
class _Spooled:
    """What a spool task returns to the driver: counts, statistics and what it skipped, never rows."""

    rows: tuple[int, ...] = ()
    """Rows of each batch spooled, in order (plain ints)."""
    consumed: int = 0
    stats: Tally = field(default_factory=Tally)
    report: ReadReport = field(default_factory=ReadReport)


def spool_path(directory: str, index: int) -> str:
    return os.path.join(directory, f"s{index:09d}.arrow")


def _spool(job: _SpoolJob, item: tuple[int, ReadUnit]) -> _Spooled:
    """The spool task of unit `index`: its output batches to one uncompressed Arrow IPC file of its own, published
    by a rename once complete (a retried task replaces, never adds)."""
    index, unit = item
    fs.check_shared(job.directory, job.name)
    writing = os.path.join(job.directory, f".s{index:09d}-{uuid.uuid4().hex}.arrow")
    out, rows = _Spooled(), []
    sink: pa.OSFile | None = None
    writer: pa.ipc.RecordBatchFileWriter | None = None
    try:
        for thing in unit(out.report):
            made, stats = job.emitted(thing)
            for piece in made:
                batches, consumed = piece()
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
class SpooledBatches(SortedBatches):
    """Spooled output (ops.regroup.SortedBatches): batch k is the k-th batch of the spool files in unit order."""

    directory: str
    units: tuple[int, ...]
    """The unit of each spool file, in order (units that wrote no batch have none)."""
    per_file: tuple[int, ...]
    """Batches in each spool file."""
    sizes: tuple[int, ...]
    """Rows of each batch."""

    @functools.cached_property
    def firsts(self) -> np.ndarray:  # type: ignore[override]
        return firsts_of(self.sizes)

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


def _spool_all(job: Job, out: Streamed, space: Workspace, report: ReadReport,
               tasks: Executor) -> tuple[SpooledBatches, int]:
    """Run the spool tasks on the engine: the spooled batches and the input rows they complete; each task's
    statistics go to out.merge and what it skipped to `report`, in input order."""
    units, per_file, sizes, consumed = [], [], [], 0
    total = out.total_rows if out.total_rows is not None else job.source.progress_rows
    spool_job = _SpoolJob(space.directory, out.emitted, job.dst)
    with progress.bar(f"{job.name}: spool", total, job.run.shown) as bar:
        for index, spooled in enumerate(tasks.map(functools.partial(_spool, spool_job), enumerate(out.units))):
            if spooled.rows:
                units.append(index)
                per_file.append(len(spooled.rows))
                sizes.extend(spooled.rows)
            if out.merge is not None:
                out.merge(spooled.stats)
            report.merge(spooled.report)
            consumed += spooled.consumed
            bar.update(spooled.consumed)
    return SpooledBatches(space.directory, tuple(units), tuple(per_file), tuple(sizes)), consumed


class _CountingFile:
    """A file that only counts what is written to it: a shard's size, batch by batch, without keeping it."""

    def __init__(self) -> None:
        self.bytes = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self.bytes += memoryview(data).nbytes
        return memoryview(data).nbytes

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    @property
    def writable(self) -> bool:
        return True


def _measure(batches: Encoded) -> list[int]:
    """A task over a run of batches: the bytes each adds to a file of its own, counted as BatchShardWriter counts a
    shard's (its first with all the file holds before it, the header; output.ShardCutter)."""
    file = _CountingFile()
    sink = batches.output.spec.open_sink(file, batches.stored, batches.output)
    sizes: list[int] = []
    for encoded in batches():
        before = file.bytes if sizes else 0
        if encoded.framed is not None:
            sizes.append(len(encoded.framed))
            continue
        sink.write(encoded)
        sizes.append(file.bytes - before)
    sink.abandon()
    return sizes


def header_bytes(output: OutputOptions, stored: pa.Schema) -> int:
    """The bytes a file of this output holds before its first batch's own: what its sink writes when opened, and
    what the format writes with a file's first batch (Arrow IPC its schema; its data is decoded of dictionaries,
    so no batch adds any). An empty batch written twice shows it, without reading any data."""
    empty = pa.RecordBatch.from_pylist([], schema=stored)
    first, again = _measure(Encoded(lambda: iter([empty, empty]), output, stored))
    return first - again


@dataclass(frozen=True)
class _Shard:
    """One shard to write on a worker: `batches` (planned [start, end) of the output) as part-<index>."""

    batches: Encoded
    index: int
    directory: str
    scratch: str
    name: str
    carried: str | None = None
    """Where the example ids its batches carry are kept (CarriedWriter); None: dropped."""


def _write_shard(shard: _Shard) -> dict:
    """Write one shard with the local writer, rollover off (shard_ends placed it), in a scratch directory of its
    own, then moved beside the others; its manifest entry."""
    with suppress(FileExistsError):  # (a retried task) not makedirs: see exchange._scatter_into
        os.mkdir(shard.scratch)
    writer = BatchShardWriter(shard.scratch, shard.batches.stored, shard.batches.output, name=shard.name,
                              first=shard.index, rollover=False)
    carried = None if shard.carried is None else CarriedWriter(shard.carried)
    try:
        for encoded in shard.batches(None if carried is None else carried.add):
            writer.write(encoded)
    finally:
        if carried is not None:
            carried.close()
    entry = writer.close()[0]
    os.replace(os.path.join(shard.scratch, entry["path"]), os.path.join(shard.directory, entry["path"]))
    return entry


def write_sorted(batches: SortedBatches, output: OutputOptions, stored: pa.Schema, directory: str, scratch: str,
                 name: str, segments: int, tasks: Executor,
                 carried: bool = False) -> tuple[list[dict], tuple[str, ...]]:
    """Write batches on the engine's workers as the local writer would: measure every batch's size (`segments`
    tasks; not when only --shard-rows and the format's batches per shard apply, which need no size), place the
    shard boundaries with output.shard_ends, and write the shards in parallel; their manifest entries, and with
    `carried` where each shard kept the example ids its batches carried (in output order)."""
    def encoded(start: int, end: int) -> Encoded:
        return Encoded(batches.reader(start, end), output, stored)

    rows = np.diff(batches.firsts).tolist()
    header, sizes = 0, [0] * batches.count
    if output.shard_bytes is not None and batches.count:
        step = -(-batches.count // max(1, segments))
        header = header_bytes(output, stored)
        measured = tasks.map(_measure, [encoded(*run) for run in runs_of(batches.count, step)])
        sizes = [size - (header if i == 0 else 0) for run in measured for i, size in enumerate(run)]
    ends = shard_ends(output, header, rows, sizes)
    shards = [_Shard(encoded(start, end), i, directory, os.path.join(scratch, f"w{i:06d}"), name,
                     os.path.join(scratch, f"w{i:06d}", "examples") if carried else None)
              for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
    return list(tasks.map(_write_shard, shards)), tuple(s.carried for s in shards if s.carried is not None)


def write_on_workers(job: Job, produced: Cut | Streamed, output: OutputOptions, stored: pa.Schema, tmp: str,
                     space: Workspace, report: ReadReport, tasks: Executor,
                     carried: bool = False) -> tuple[list[dict], int, int, tuple[str, ...]]:
    """The job's shards written by tasks on the executor's workers (a stream spooled first, the example ids its
    batches carry with them): their manifest entries, the input rows, the rows written, and with `carried` where
    the shards kept those ids (in output order)."""
    if isinstance(produced, Streamed):
        batches, rows_in = _spool_all(job, produced, space, report, tasks)
    else:
        batches, rows_in = produced.batches, produced.batches.rows
    with progress.bar(f"{job.name}: write", batches.rows, job.run.shown) as bar:
        files, kept = write_sorted(batches, output, stored, tmp, space.directory, job.dst,
                                   MEASURES_PER_WORKER * tasks.shares.tasks, tasks, carried)
        bar.update(batches.rows)
    return files, rows_in, batches.rows, kept


__all__ = ["Encoded", "Kept", "SpoolReader", "SpooledBatches", "runs_of", "spool_path", "stored_batches", "write_on_workers",
           "write_sorted"]
