"""Writing a job's output, the one way every command, pipeline and convert writes: the output is produced in the
run's workspace (batchtool.io.workspace), written as batch shards, then the manifest, then moved into place.

What is produced is one of two things, and the engine decides only how its batches reach the shards:
- sorted batches (ops.regroup.Cut, an exchange's output, re-readable by any worker): the local engine reads and
  encodes runs of them on its threads and one writer appends them in order; a remote engine measures their sizes
  and writes every shard in a task of its own, cut where the one writer would cut it (output.shard_ends);
- a stream (Streamed): tasks whose work makes output batches in order (a row op's kernel over each read unit, a
  regrouping's items): the local engine hands their batches to the one writer as they come; a remote engine has
  each task spool its batches to the workspace, then writes shards from the spool files as above.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, suppress
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from batchtool.core import fs, progress
from batchtool.io import manifest as manifest_mod
from batchtool.io.dataset import Dataset, ReadReport
from batchtool.exec.exchange import ReadUnit
from batchtool.io.formats.base import EncodedBatch
from batchtool.core.run_settings import RunSettings
from batchtool.exec.job import JobResult, read_paths
from batchtool.ops.regroup import Cut, SortedBatches
from batchtool.core.tally import Tally
from batchtool.io.output import BatchShardWriter, OutputOptions, encode_batch, output_directory, shard_ends
from batchtool.core.runner import Executor
from batchtool.io.workspace import Workspace, tasks_executor, workspace

MEASURES_PER_WORKER = 2
"""A remote engine measures sorted batches in this many tasks per worker CPU, so every worker encodes."""
RUN_BYTES = 1 << 20
"""About the sorted bytes one task of the local writer reads and encodes (at least one batch), at least: a few such
runs wait for the writer at a time (the local engine's window), so this stays a small part of any budget."""
RUN_BYTES_MAX = 8 << 20
"""At most this, where --memory allows (run_bytes): every run reopens the sorted ranges it reads from files, and
with 1 MiB runs that cost bucket about a tenth of its writing (measured)."""
RUN_SHARE = 16
"""The runs in flight (the window: threads + 1), each held about three times over (sorted rows, padded, encoded),
take at most about 3/RUN_SHARE of --memory."""

Deferred = Callable[[], tuple[list[pa.RecordBatch], int]]
"""Output batches not made yet, and the input rows they complete once made."""
Emitted = Callable[[Any], tuple[Iterable[Deferred], Tally]]
"""A unit's work on one thing it yields (a chunk it read, or an item the driver made): the pieces of output it
makes, in order, and its statistics. A piece is made where its batches are wanted, one at a time (so an op whose
output outgrows its input, in bounded pieces, never holds more than one)."""


@dataclass(frozen=True)
class Job:
    """What one run writes, and how it is recorded: everything but the batches themselves."""

    command: str
    options: dict[str, Any]
    """What the manifest records of the options."""
    seed: int | None
    source: Dataset
    """The input the manifest describes (a pipeline's source, whatever its last stage reads)."""
    dst: str
    output: OutputOptions
    schema: pa.Schema
    run: RunSettings
    who: str | None = None
    """What its progress bars name (a pipeline's stage; None: the command)."""
    started: float = field(default_factory=time.perf_counter)
    manifest_stats: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    """A pipeline's statistics from its last stage's and the rows written; None: the op's own."""

    @property
    def name(self) -> str:
        return self.who or self.command


@dataclass(frozen=True)
class Item:
    """One thing the driver made (a regrouping's item, a chunk with its plan) as a unit: all its task works on."""

    item: Any

    def __call__(self, report: ReadReport) -> Iterator[Any]:
        yield self.item


@dataclass(frozen=True)
class Streamed:
    """Output made as it streams: one task per unit (in order) applies `emitted` to what the unit yields."""

    units: Iterable[ReadUnit]
    emitted: Emitted
    stats: Callable[[], dict[str, Any]]
    """The manifest's statistics once every unit's are merged."""
    merge: Callable[[Tally], None] | None = None
    """Takes each unit's statistics, in input order (None: they have none)."""
    total_rows: int | None = None
    """The input rows the units complete (the progress total); None: the source's."""
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records."""


Produced = Cut | Streamed
Produce = Callable[[Workspace, ReadReport], AbstractContextManager[Produced]]
"""produce(workspace, report): the output, made in the workspace (an exchange's sorted batches) or to be made as it
streams, valid while the block is open; `report` takes what the reading skips."""


def write(job: Job, produce: Produce, executor: Executor, report: ReadReport | None = None) -> JobResult:
    """Produce the job's output in a workspace, write it as batch shards in DST's temporary directory on the
    executor, then the manifest, and move the directory into place (output.output_directory: all or nothing)."""
    report = ReadReport() if report is None else report
    casts = job.output.casts(job.schema)
    stored = job.output.stored_schema(job.schema)
    with output_directory(job.dst, job.output.overwrite, read_paths(job.source)) as tmp, \
            workspace(job.dst, executor, job.run.tmp_dir, inside=tmp) as space, produce(space, report) as produced:
        tasks = tasks_executor(space, executor)
        output = job.output if produced.sequence_columns is None else \
            replace(job.output, sequence_columns=produced.sequence_columns)
        stats = produced.stats
        if isinstance(produced, Streamed) and not tasks.remote:
            files, rows_in, rows = _write_streamed(job, produced, output, stored, tmp, report, tasks)
        else:
            if isinstance(produced, Streamed):
                batches, rows_in = _spool_all(job, produced, space, report, tasks)
            else:
                batches, rows_in = produced.batches, produced.batches.rows
            rows = batches.rows
            if not tasks.remote:
                files = _write_in_order(job, batches, output, stored, tmp, tasks)
            else:
                files = _write_sorted_on(tasks, job, batches, output, stored, tmp, space)
        manifest = write_manifest(tmp, job, casts, stored, files, rows_in, rows, report,
                                  stats if job.manifest_stats is None
                                  else functools.partial(_pipeline_stats, job.manifest_stats, stats, rows),
                                  executor.summary(), produced.padding if isinstance(produced, Cut) else None)
    return JobResult(manifest, rows_in, rows)


def _pipeline_stats(manifest_stats: Callable[[dict[str, Any], int], dict[str, Any]],
                    stats: Callable[[], dict[str, Any]], rows: int) -> dict[str, Any]:
    return manifest_stats(stats(), rows)


def write_manifest(tmp: str, job: Job, casts: dict[str, str], stored: pa.Schema, files: list[dict], rows_in: int,
                   rows_out: int, report: ReadReport, stats: Callable[[], dict[str, Any]],
                   executed: dict[str, Any], padding: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a finished output in `tmp`, written there; returns it. Its run section (the one part that
    may differ between runs writing the same bytes) says how the run went (`executed`: the executor's summary);
    `padding`: how batchtool.load pads the batches (Cut.padding)."""
    job_stats = stats()
    job_stats.update(report.stats())
    manifest = manifest_mod.build(
        command=job.command, options=job.options, seed=job.seed, dataset=job.source, output=job.output.recorded(),
        schema=stored, files=files, stats={"rows_in": rows_in, "rows_out": rows_out, **job_stats},
        run={"threads": job.run.threads, "engine": job.run.engine, **executed,
             "wall_seconds": round(time.perf_counter() - job.started, 3),
             "peak_rss_bytes": manifest_mod.peak_rss_bytes()}, padding=padding)
    if casts:
        manifest["output"]["cast"] = casts
    with fs.write_errors(f"{job.dst}: cannot write the output"):
        manifest_mod.write(tmp, manifest)
    return manifest


# -- the local engine: one writer, in order ---------------------------------------------------------------------


def _pieces(emitted: Emitted, unit: ReadUnit) -> tuple[list[Deferred], Tally, ReadReport]:
    """A unit's first task on a local thread: what it reads, worked into pieces not made yet, its statistics and
    what its reading skipped."""
    pieces: list[Deferred] = []
    stats, report = Tally(), ReadReport()
    for thing in unit(report):
        made, thing_stats = emitted(thing)
        pieces += made
        stats.merge(thing_stats)
    return pieces, stats, report


def _made(output: OutputOptions, piece: Deferred) -> tuple[list[EncodedBatch], int]:
    """A piece's second task on a local thread: its batches made and encoded, and the input rows they complete."""
    batches, consumed = piece()
    return [encode_batch(b, output) for b in batches], consumed


def _write_streamed(job: Job, out: Streamed, output: OutputOptions, stored: pa.Schema, tmp: str,
                    report: ReadReport, tasks: Executor) -> tuple[list[dict], int, int]:
    """The units' tasks on the engine's threads (each unit's work, then each piece of it made and encoded), their
    batches appended in order by one writer here."""
    rows_in = rows_out = 0
    total = out.total_rows if out.total_rows is not None else job.source.progress_rows

    def pieces() -> Iterator[Deferred]:  # on the second map's reader thread, in input order
        for made, stats, skipped in tasks.map(functools.partial(_pieces, out.emitted), out.units):
            if out.merge is not None:
                out.merge(stats)
            report.merge(skipped)
            yield from made

    results = tasks.map(functools.partial(_made, output), pieces())
    # closed, however the block ends, before the directories are removed: the units' source may still be writing
    # temporary files of its own on the reader thread
    with BatchShardWriter(tmp, stored, output, name=job.dst, overlap=tasks.threads > 1) as writer, \
            progress.bar(f"{job.name}: write", total, job.run.shown) as bar, closing(results):
        for encoded, consumed in results:
            for batch in encoded:
                writer.write(batch)
                rows_out += batch.data.num_rows
            rows_in += consumed
            bar.update(consumed)
    return writer.close(), rows_in, rows_out


@dataclass(frozen=True)
class _Encoded:
    """Output batches [start, end) of sorted batches (SortedBatches.reader), encoded for the output."""

    read: Callable[[], Iterator[pa.RecordBatch]]
    output: OutputOptions
    stored: pa.Schema

    def __call__(self) -> Iterator[EncodedBatch]:
        for batch in self.read():
            yield encode_batch(batch, self.output)


def _encoded_run(batches: _Encoded) -> list[EncodedBatch]:
    return list(batches())


def runs_of(count: int, step: int) -> list[tuple[int, int]]:
    """[start, end) runs of `step` batches each (the last one shorter) over `count` batches."""
    return [(k, min(k + step, count)) for k in range(0, count, step)]


def sized_runs(batches: SortedBatches, nbytes: int) -> list[tuple[int, int]]:
    """Runs of about `nbytes` of sorted batches each, at least one batch."""
    return runs_of(batches.count, max(1, int(nbytes * batches.count / max(1, batches.nbytes()))))


def run_bytes(run: RunSettings) -> int:
    """The sorted bytes of one run of the local writer: as large as the run's --memory allows for its threads'
    window, between RUN_BYTES and RUN_BYTES_MAX."""
    return max(RUN_BYTES, min(RUN_BYTES_MAX, run.budget // (RUN_SHARE * (run.threads + 1))))


def _write_in_order(job: Job, batches: SortedBatches, output: OutputOptions, stored: pa.Schema, tmp: str,
                    tasks: Executor) -> list[dict]:
    """Sorted batches read and encoded in runs on the engine's threads, appended in order by one writer here, whose
    shards roll over as the batches come (output.ShardCutter)."""
    runs = [_Encoded(batches.reader(start, end), output, stored)
            for start, end in sized_runs(batches, run_bytes(job.run))]
    with BatchShardWriter(tmp, stored, output, name=job.dst, overlap=tasks.threads > 1) as writer, \
            progress.bar(f"{job.name}: write", batches.rows, job.run.shown) as bar:
        for encoded in tasks.map(_encoded_run, runs):
            for batch in encoded:
                writer.write(batch)
                bar.update(batch.data.num_rows)
    return writer.close()


# -- a remote engine: spooled by the tasks that make them, shards written by tasks of their own ---------------


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
class SpooledBatches:
    """Spooled output (ops.regroup.SortedBatches): batch k is the k-th batch of the spool files in unit order."""

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


def _measure(batches: _Encoded) -> tuple[int | None, list[int]]:
    """A task over a run of batches: the size of each as output.ShardCutter counts it, and the file's header
    bytes (None: no batch showed them). A sink that only counts is fed every batch; the first is fed twice,
    since a format may write its header with the first batch (Arrow IPC does), never with the second."""
    file = _CountingFile()
    sink = batches.output.spec.open_sink(file, batches.stored, batches.output)
    opened, header, sizes = file.bytes, None, []
    for encoded in batches():
        if encoded.framed is not None:
            header = 0
            sizes.append(len(encoded.framed))
            continue
        before = file.bytes
        sink.write(encoded)
        size = file.bytes - before
        if header is None:
            sink.write(encoded)
            header = opened + 2 * size - (file.bytes - before)
            size -= header - opened
        sizes.append(size)
    sink.abandon()
    return header, sizes


@dataclass(frozen=True)
class _Shard:
    """One shard to write on a worker: `batches` (planned [start, end) of the output) as part-<index>."""

    batches: _Encoded
    index: int
    directory: str
    scratch: str
    name: str


def _write_shard(shard: _Shard) -> dict:
    """Write one shard with the local writer, rollover off (shard_ends placed it), in a scratch directory of its
    own, then moved beside the others; its manifest entry."""
    with suppress(FileExistsError):  # (a retried task) not makedirs: see exchange._scatter_into
        os.mkdir(shard.scratch)
    writer = BatchShardWriter(shard.scratch, shard.batches.stored, shard.batches.output, name=shard.name,
                              first=shard.index, rollover=False)
    for encoded in shard.batches():
        writer.write(encoded)
    entry = writer.close()[0]
    os.replace(os.path.join(shard.scratch, entry["path"]), os.path.join(shard.directory, entry["path"]))
    return entry


def write_sorted(batches: SortedBatches, output: OutputOptions, stored: pa.Schema, directory: str, scratch: str,
                 name: str, segments: int, tasks: Executor) -> list[dict]:
    """Write batches on the engine's workers as the local writer would: measure every batch's size (`segments`
    tasks; not when only --shard-rows and the format's batches per shard apply, which need no size), place the
    shard boundaries with output.shard_ends, and write the shards in parallel."""
    def encoded(start: int, end: int) -> _Encoded:
        return _Encoded(batches.reader(start, end), output, stored)

    rows = [batches.batch_rows(k) for k in range(batches.count)]
    header, sizes = 0, [0] * batches.count
    if output.shard_bytes is not None and batches.count:
        step = -(-batches.count // max(1, segments))
        measured = list(tasks.map(_measure, [encoded(*run) for run in runs_of(batches.count, step)]))
        header = next((h for h, _ in measured if h is not None), 0)
        sizes = [size for _, run in measured for size in run]
    ends = shard_ends(output, header, rows, sizes)
    shards = [_Shard(encoded(start, end), i, directory, os.path.join(scratch, f"w{i:06d}"), name)
              for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
    return list(tasks.map(_write_shard, shards))


def _write_sorted_on(tasks: Executor, job: Job, batches: SortedBatches, output: OutputOptions, stored: pa.Schema,
                     tmp: str, space: Workspace) -> list[dict]:
    with progress.bar(f"{job.name}: write", batches.rows, job.run.shown) as bar:
        files = write_sorted(batches, output, stored, tmp, space.directory, job.dst,
                             MEASURES_PER_WORKER * max(1, getattr(tasks, "cpus", tasks.threads)), tasks)
        bar.update(batches.rows)
    return files


__all__ = ["Emitted", "Item", "Job", "Deferred", "Produce", "Produced", "SpoolReader", "SpooledBatches", "Streamed",
           "spool_path", "write", "write_manifest", "write_sorted"]
