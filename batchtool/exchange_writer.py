"""A global reorder written on the engine's workers (--engine ray, DST a path): an op's Exchange plan
(ops/base.py) run through batchtool.exchange's map and reduce tasks, and the sorted rows cut into batches and
written as shards there, exactly where the local writer would cut them; the driver plans, counts and writes
the manifest. The same bytes and statistics as the op's own regroup on the driver."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import exchange, progress, runner
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.formats.base import EncodedBatch
from batchtool.job import JobResult, RunSettings, read_paths, write_manifest
from batchtool.ops.base import Bar, Batches, Cut, Exchange, Operation, Regrouped, Runtime, Scattered
from batchtool.output import BatchShardWriter, OutputOptions, encode_batch, output_directory, shard_ends
from batchtool.runner import ordered_map
from batchtool.workspace import Workspace, workspace

MEASURES_PER_WORKER = 2
"""A distributed reorder measures its batches in this many tasks per worker CPU, so every worker encodes."""


@dataclass(frozen=True)
class _Encoded:
    """Output batches [start, end) (an exchange's Batches.reader) as write_job would encode them."""

    read: Callable[[], Iterator[pa.RecordBatch]]
    output: OutputOptions
    stored: pa.Schema

    def __call__(self) -> Iterator[EncodedBatch]:
        for batch in self.read():
            yield encode_batch(batch, self.output)


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
    with suppress(FileExistsError):  # (a retried task) not makedirs: see exchange._map
        os.mkdir(shard.scratch)
    writer = BatchShardWriter(shard.scratch, shard.batches.stored, shard.batches.output, name=shard.name,
                              first=shard.index, rollover=False)
    for encoded in shard.batches():
        writer.write(encoded)
    entry = writer.close()[0]
    os.replace(os.path.join(shard.scratch, entry["path"]), os.path.join(shard.directory, entry["path"]))
    return entry


RUN_BYTES = 1 << 20
"""About the sorted bytes one task of the local writer reads and encodes (at least one batch): a few such runs wait
for the writer at a time (the local engine's window), so this stays a small part of any budget."""


def _encoded_run(batches: _Encoded) -> list[EncodedBatch]:
    return list(batches())


def write_in_order(batches: Batches, output: OutputOptions, stored: pa.Schema, directory: str, name: str,
                   threads: int, bar: Bar) -> list[dict]:
    """Write an exchange's batches with one writer, in order, while the engine's workers read and encode runs of
    them: the local engine's way, where the writer's shards roll over as the batches come (output.ShardCutter)."""
    writer = BatchShardWriter(directory, stored, output, name=name)
    step = max(1, int(RUN_BYTES * batches.count / max(1, batches.nbytes())))
    runs = [_Encoded(batches.reader(k, min(k + step, batches.count)), output, stored)
            for k in range(0, batches.count, step)]
    for encoded in ordered_map(_encoded_run, runs, threads):
        for batch in encoded:
            writer.write(batch)
            bar.update(batch.data.num_rows)
    return writer.close()


def write_sorted(batches: Batches, output: OutputOptions, stored: pa.Schema, directory: str, scratch: str,
                 name: str, segments: int, threads: int) -> list[dict]:
    """Write an exchange's batches as the local writer would, on the engine's workers: measure every batch's
    size (`segments` tasks; not when only --shard-rows and the format's batches per shard apply, which need no
    size), place the shard boundaries with output.shard_ends, and write the shards in parallel."""
    def encoded(start: int, end: int) -> _Encoded:
        return _Encoded(batches.reader(start, end), output, stored)

    rows = [batches.batch_rows(k) for k in range(batches.count)]
    header, sizes = 0, [0] * batches.count
    if output.shard_bytes is not None and batches.count:
        step = -(-batches.count // max(1, segments))
        measured = list(ordered_map(_measure, [encoded(k, min(k + step, batches.count))
                                               for k in range(0, batches.count, step)], threads))
        header = next((h for h, _ in measured if h is not None), 0)
        sizes = [size for _, run in measured for size in run]
    ends = shard_ends(output, header, rows, sizes)
    shards = [_Shard(encoded(start, end), i, directory, os.path.join(scratch, f"w{i:06d}"), name)
              for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
    return list(ordered_map(_write_shard, shards, threads))


@contextmanager
def on_engine_of(space: Workspace) -> Iterator[Any]:
    """Within the block, the engine that may write the workspace: the active one if the workspace is shared with
    its workers, else the driver's threads (None)."""
    engine = runner.active_engine() if space.shared else None
    with runner.use_engine(engine):
        yield engine


def _planned(op: Operation, plan: Any, units: Iterator[exchange.ReadUnit], dataset: Dataset, threads: int,
             like: Chunk | None = None) -> tuple[Exchange | None, Iterator[exchange.ReadUnit]]:
    """The op's Exchange plan, and the units with the probed put back. Its probe measures the input's first chunk
    (read on a worker), or `like` when given (a pipeline's narrow pass, cut as the full input is)."""
    def probe(measure: Any) -> Any:
        nonlocal units
        if like is not None:
            return measure(like)
        found, units = exchange.probe(units, measure, threads)
        return found

    return op.exchange(plan, dataset, probe), units


def _exchanged(reorder: Exchange, units: Iterable[exchange.ReadUnit], space: Workspace, dataset: Dataset,
               run: RunSettings, report: ReadReport, desc: str, runtime: Runtime) -> Cut:
    """The map and reduce tasks (every row to its key range in the workspace, each range sorted), then the
    op's cut of the sorted rows into batches."""
    plan = reorder.scatter
    job = exchange.MapJob(space, plan)
    if reorder.rows is not None:
        rows, stats = exchange.scatter_here(reorder.rows(runtime, report), job, desc, None, run.quiet)
    else:
        rows, stats = exchange.scatter(units, job, run.threads, report, desc, dataset.progress_rows, run.quiet)
    groups = exchange.sort_groups(job, rows, run.threads)
    scattered = Scattered(plan.schema, list(groups), np.array([int(r.sum()) for r in rows], dtype=np.int64), stats)
    return reorder.cut(scattered, runtime)


@dataclass
class SortedRegrouped(Regrouped):
    """A regrouping whose batches are in sorted files every worker reads (`batches`): a reader after it may read
    them itself, where it runs, instead of through the items."""

    batches: Batches | None = None


def _read_batches(read: Callable[[], Iterator[pa.RecordBatch]]) -> tuple[list[pa.RecordBatch], int]:
    """A regrouped item on a worker: its batches read from the sorted files, and the rows they hold."""
    batches = list(read())
    return batches, sum(b.num_rows for b in batches)


@contextmanager
def regrouped_exchanged(op: Operation, plan: Any, dataset: Dataset, units: Iterator[exchange.ReadUnit], dst: str,
                        run: RunSettings, report: ReadReport, desc: str, runtime: Runtime, *,
                        tmp_dir: str | None = None, like: Chunk | None = None) -> Iterator[Regrouped | None]:
    """The op's regrouping as `regroup` gives it (a pipeline streams it on to the stages after it), but with the
    rows scattered and sorted on the workers, through files in a directory beside DST, and every item's
    batches read from the sorted files on a worker; None if the op has no Exchange plan. The same batches as
    `regroup` (the same keys, key ranges and cuts); the files are removed when the block ends. None too when
    DST's parent does not exist yet (the output's writer makes it, and removes it on failure)."""
    reorder, units = _planned(op, plan, units, dataset, run.threads, like)
    if reorder is None:
        yield None
        return
    with workspace(dst, tmp_dir) as space, on_engine_of(space):
        cut = _exchanged(reorder, units, space, dataset, run, report, desc, runtime)
        batches = cut.batches
        step = max(1, -(-batches.count // sum(reorder.scatter.parts)))  # about a key range per item
        items = [batches.reader(k, min(k + step, batches.count)) for k in range(0, batches.count, step)]
        yield SortedRegrouped(items, _read_batches, cut.stats, total_rows=batches.rows, batches=batches)


Produce = Callable[[Workspace], tuple[Cut, int]]
"""produce(workspace): the output batches, made on the workers in files in the workspace, with the manifest's
statistics once they are written, and the input rows they complete."""


def write_beside(produce: Produce, output: OutputOptions, *, command: str, options: dict[str, Any],
                 seed: int | None, dataset: Dataset, dst: str, schema: pa.Schema, run: RunSettings,
                 source: Dataset | None = None, report: ReadReport | None = None, started: float | None = None,
                 who: str | None = None, tmp_dir: str | None = None,
                 manifest_stats: Callable[[dict[str, Any], int], dict[str, Any]] | None = None) -> JobResult:
    """An output written on the engine's workers, as write_job writes it: `produce` makes the batches in a workspace
    in DST's temporary directory (beside DST, on storage every worker shares), write_sorted writes them as shards
    there, and the driver writes the manifest and commits.

    A pipeline's last stage passes the `source` the manifest describes (`dataset` is its own input), its `report`
    of skipped records, when it `started`, `who` its bars name, and `manifest_stats(op statistics, rows
    written)`, the pipeline's statistics."""
    started = time.perf_counter() if started is None else started
    report = ReadReport() if report is None else report
    source = dataset if source is None else source
    casts = output.casts(schema)
    stored = output.stored_schema(schema)
    with output_directory(dst, output.overwrite, read_paths(source)) as tmp, \
            workspace(dst, tmp_dir, inside=tmp) as space, on_engine_of(space) as engine:
        cut, rows_in = produce(space)
        batches, stats = cut.batches, cut.stats
        if cut.sequence_columns is not None:
            output = replace(output, sequence_columns=cut.sequence_columns)
        rows = batches.rows
        with progress.bar(f"{who or command}: write", rows, quiet=run.quiet) as bar:
            if engine is None:
                files = write_in_order(batches, output, stored, tmp, dst, run.threads, bar)
            else:
                files = write_sorted(batches, output, stored, tmp, space.directory, dst,
                                     MEASURES_PER_WORKER * max(1, getattr(engine, "cpus", run.threads)), run.threads)
                bar.update(rows)
        manifest = write_manifest(tmp, command=command, options=options, seed=seed, dataset=source, dst=dst,
                                  output=output, schema=stored, casts=casts, files=files, rows_in=rows_in,
                                  rows_out=rows, run=run, report=report, started=started,
                                  stats=stats if manifest_stats is None else lambda: manifest_stats(stats(), rows))
    return JobResult(manifest, rows_in, rows)


def write_exchanged(op: Operation, plan: Any, output: OutputOptions, runtime: Runtime, *,
                    units: Iterator[exchange.ReadUnit] | None = None, **job: Any) -> JobResult | None:
    """The op's regrouping with no row passing through the driver, if it has an Exchange plan (else None): map
    tasks on the workers read the input (`units`, default the dataset's) and scatter it to key ranges beside
    DST (batchtool.exchange), reduce tasks sort each range, the op cuts the sorted rows into batches and the
    shards are measured and written there in parallel (write_beside); the driver plans, counts and writes the
    manifest. The same bytes and statistics as the op's own regroup: the same keys, key ranges and order,
    batches cut from the same chunks, the same writer and shard boundaries. `job`: write_beside's arguments."""
    dataset, run = job["dataset"], job["run"]
    report = job.setdefault("report", ReadReport())
    units = exchange.read_units(dataset, report) if units is None else units
    reorder, units = _planned(op, plan, units, dataset, run.threads)
    if reorder is None:
        return None

    def produce(space: Workspace) -> tuple[Cut, int]:
        who = job.get("who") or job["command"]
        cut = _exchanged(reorder, units, space, dataset, run, report, f"{who}: spill", runtime)
        return cut, cut.batches.rows

    return write_beside(produce, output, **job)


__all__ = ["Produce", "SortedRegrouped", "regrouped_exchanged", "write_beside", "write_exchanged", "write_sorted"]
