"""A global reorder written on the engine's workers (--engine ray, DST a path): an op's Exchange plan
(ops/base.py) run through batchtool.exchange's map and reduce tasks, and the sorted rows cut into batches and
written as shards there, exactly where the local writer would cut them; the driver plans, counts and writes
the manifest. The same bytes and statistics as the op's own regroup on the driver."""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batchtool import exchange, fs, progress, runner
from batchtool.dataset import Dataset, ReadReport
from batchtool.exchange import SortedGroup
from batchtool.formats.base import EncodedBatch
from batchtool.job import JobResult, RunSettings, read_paths, write_manifest
from batchtool.ops.base import Exchange, Operation, Regrouped
from batchtool.ops.rows import RowReader
from batchtool.output import BatchShardWriter, OutputOptions, encode_batch, output_directory
from batchtool.runner import ordered_map

ONE_SHARD_MARGIN = 1
"""Sorted data (Arrow) this many times smaller than --shard-bytes is planned as one shard without measuring
its encoded size: encoding rarely makes data larger, and the shard task stops at once if the writer cuts
it earlier (see _write_shard), which then costs one shard's encoding."""
MEASURES_PER_WORKER = 2
"""A distributed reorder measures its batches in this many tasks per worker CPU, so every worker encodes."""


@dataclass(frozen=True)
class SortedCut:
    """The output batches of a sorted stream (SortedGroup) as the op's regroup cuts them: batch k holds rows
    [k * batch_rows, (k + 1) * batch_rows) of the first `rows` (the remainder already dropped if asked)."""

    rows_in: SortedGroup
    schema: pa.Schema
    batch_rows: int
    rows: int

    @property
    def count(self) -> int:
        return -(-self.rows // self.batch_rows)

    def cut(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Batches [start, end), cut from the same chunks at the same offsets as a local run, so laid out the
        same."""
        first = start * self.batch_rows
        reader = RowReader(self.rows_in.chunks(first), self.schema)
        reader.take(first - self.rows_in.first_row(first))
        for k in range(start, end):
            yield reader.take(min(self.batch_rows, self.rows - k * self.batch_rows)).data


@dataclass(frozen=True)
class _Batches(SortedCut):
    """The sorted stream's batches as write_job would write them."""

    output: OutputOptions
    stored: pa.Schema

    def encoded(self, start: int, end: int) -> Iterator[EncodedBatch]:
        """Batches [start, end), encoded."""
        for batch in self.cut(start, end):
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


def _measure(job: tuple[_Batches, int, int]) -> tuple[int, list[int]]:
    """A map task over batches [start, end): the bytes a shard holds once opened, and the bytes each batch
    adds to it (one sink for the whole run, whose file only counts)."""
    batches, start, end = job
    file = _CountingFile()
    sink = batches.output.spec.open_sink(file, batches.stored, batches.output)
    opened, added = file.bytes, []
    for encoded in batches.encoded(start, end):
        before = file.bytes
        sink.write(encoded)
        added.append(file.bytes - before)
    sink.abandon()
    return opened, added


def _shard_ends(sizes: Iterable[tuple[int, Iterable[int]]], batches: _Batches) -> list[int]:
    """Where BatchShardWriter would close each shard, from the measured sizes: after the batch that reaches
    --shard-rows, --shard-bytes or the format's batches per shard (OutputOptions.shard_full), and at the end."""
    o = batches.output
    ends: list[int] = []
    rows = size = count = k = 0
    for opened, added in sizes:
        for batch_bytes in added:
            if count == 0:
                rows, size = 0, opened
            rows += min(batches.batch_rows, batches.rows - k * batches.batch_rows)
            size += batch_bytes
            count += 1
            k += 1
            if o.shard_full(rows, size, count):
                ends.append(k)
                count = 0
    if not ends or ends[-1] != batches.count:
        ends.append(batches.count)
    return ends


@dataclass(frozen=True)
class _Shard:
    """One shard to write on a worker: batches [start, end) as part-<index>."""

    batches: _Batches
    index: int
    start: int
    end: int
    last: bool
    directory: str
    scratch: str
    name: str


def _write_shard(shard: _Shard) -> dict | None:
    """Write one shard with the local writer; its manifest entry, or None if the writer did not close it
    exactly where planned (a format whose shard size is not the sum of its batches' sizes): then the
    driver writes every shard in one task instead."""
    with suppress(FileExistsError):  # (a retried task) not makedirs: see exchange._map
        os.mkdir(shard.scratch)
    writer = BatchShardWriter(shard.scratch, shard.batches.stored, shard.batches.output, name=shard.name)
    for written, encoded in enumerate(shard.batches.encoded(shard.start, shard.end), 1):
        writer.write(encoded)
        if "sha256" in writer.files[0] and written < shard.end - shard.start:  # cut before the planned end
            return None
    closed_by_writer = "sha256" in writer.files[0]
    files = writer.close()
    if not (closed_by_writer or shard.last):
        return None
    entry = dict(files[0], path=f"part-{shard.index:05d}{shard.batches.output.suffix}")
    os.replace(os.path.join(shard.scratch, files[0]["path"]), os.path.join(shard.directory, entry["path"]))
    return entry


def _write_all(job: tuple[_Batches, str, str, str]) -> list[dict]:
    """Every shard in one task, in order: the writer run exactly as write_job runs it (in the scratch
    directory, then moved, so nothing is written in DST's temporary directory once the exchange is gone)."""
    batches, directory, scratch, name = job
    os.mkdir(scratch)
    writer = BatchShardWriter(scratch, batches.stored, batches.output, name=name)
    for encoded in batches.encoded(0, batches.count):
        writer.write(encoded)
    files = writer.close()
    for entry in files:
        os.replace(os.path.join(scratch, entry["path"]), os.path.join(directory, entry["path"]))
    return files


def write_sorted(batches: _Batches, directory: str, scratch: str, name: str, segments: int,
                 threads: int) -> list[dict]:
    """Write a sorted stream's batches as the local writer would, on the engine's workers: measure every
    batch's encoded size (`segments` tasks; not when no --shard-bytes applies, or the data is far smaller),
    place the shard boundaries as the writer would, write the shards in parallel. Falls back to one task
    writing them all when a shard task finds the writer would have cut elsewhere."""
    if batches.count:
        output = batches.output
        if output.shard_bytes is None or batches.rows_in.nbytes() * ONE_SHARD_MARGIN <= output.shard_bytes:
            sizes: Iterable[tuple[int, Iterable[int]]] = [(0, itertools.repeat(0, batches.count))]
        else:
            step = -(-batches.count // max(1, segments))
            sizes = ordered_map(_measure, [(batches, k, min(k + step, batches.count))
                                           for k in range(0, batches.count, step)], threads)
        ends = _shard_ends(sizes, batches)
        shards = [_Shard(batches, i, start, end, i == len(ends) - 1, directory, os.path.join(scratch, f"w{i:06d}"),
                         name) for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
        files = list(ordered_map(_write_shard, shards, threads))
        if all(entry is not None for entry in files):
            return files
        for entry in files:
            if entry is not None:
                os.remove(os.path.join(directory, entry["path"]))
    return next(iter(ordered_map(_write_all, [(batches, directory, os.path.join(scratch, "all"), name)], threads)))


def _planned(op: Operation, plan: Any, units: Iterator[exchange.ReadUnit], dataset: Dataset,
             threads: int) -> tuple[Exchange | None, Iterator[exchange.ReadUnit]]:
    """The op's Exchange plan (its probe's first chunk read on a worker), and the units with the probed put back."""
    def probe(measure: Any) -> Any:
        nonlocal units
        found, units = exchange.probe(units, measure, threads)
        return found

    return op.exchange(plan, dataset, probe), units


def _scatter_sorted(reorder: Exchange, units: Iterable[exchange.ReadUnit], directory: str, dataset: Dataset,
                    dst: str, run: RunSettings, report: ReadReport, desc: str) -> tuple[SortedGroup, int]:
    """The map and reduce tasks: every row to its key range under `directory`, each range sorted; the sorted
    rows and how many there are."""
    job = exchange.MapJob(directory, dataset.schema, (reorder.parts,), reorder.seed, reorder.stage,
                          reorder.flush_bytes, dst)
    part_rows = exchange.scatter(units, job, run.threads, report, desc, dataset.progress_rows, run.quiet)[0]
    group = exchange.sort_group(directory, reorder.seed, reorder.stage, 0, part_rows, run.threads)
    return group, int(part_rows.sum())


@dataclass
class SortedRegrouped(Regrouped):
    """A regrouping whose batches are in sorted files every worker reads (`cut`): a reader after it may read
    them itself, where it runs, instead of through the items."""

    cut: SortedCut | None = None


def _read_cut(cut: SortedCut, span: tuple[int, int]) -> tuple[list[pa.RecordBatch], int]:
    """A regrouped item on a worker: batches [start, end) read from the sorted files, and the rows they hold."""
    batches = list(cut.cut(*span))
    return batches, sum(b.num_rows for b in batches)


@contextmanager
def regrouped_exchanged(op: Operation, plan: Any, dataset: Dataset, units: Iterator[exchange.ReadUnit], dst: str,
                        run: RunSettings, report: ReadReport, desc: str) -> Iterator[Regrouped | None]:
    """The op's regrouping as `regroup` gives it (a pipeline streams it on to the stages after it), but with the
    rows scattered and sorted on the workers, through files in a directory beside DST, and every item's
    batches read from the sorted files on a worker; None if the op has no Exchange plan. The same batches as
    `regroup` (the same keys, key ranges and cuts); the files are removed when the block ends. None too when
    DST's parent does not exist yet (the output's writer makes it, and removes it on failure)."""
    dst = os.path.abspath(dst)
    reorder = None
    if os.path.isdir(os.path.dirname(dst)):
        reorder, units = _planned(op, plan, units, dataset, run.threads)
    if reorder is None:
        yield None
        return
    with fs.write_errors(f"{dst}: cannot write beside the output"):
        tmp = fs.make_unique_dir(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-")
    try:
        with exchange.workspace(tmp, dst) as directory:
            group, rows = _scatter_sorted(reorder, units, directory, dataset, dst, run, report, desc)
            kept = rows - (rows % reorder.batch_rows if reorder.drop_remainder else 0)
            cut = SortedCut(group, dataset.schema, reorder.batch_rows, kept)
            step = max(1, -(-kept // max(1, reorder.parts) // reorder.batch_rows))  # about a key range per item
            spans = [(k, min(k + step, cut.count)) for k in range(0, cut.count, step)]
            yield SortedRegrouped(spans, functools.partial(_read_cut, cut), lambda: reorder.stats(rows),
                                  total_rows=rows, cut=cut)
    finally:
        fs.remove_tree(tmp)


def write_exchanged(op: Operation, plan: Any, output: OutputOptions, *, command: str, options: dict[str, Any],
                    seed: int | None, dataset: Dataset, dst: str, schema: pa.Schema,
                    run: RunSettings) -> JobResult | None:
    """The op's regrouping with no row passing through the driver, if it has an Exchange plan (else None): map
    tasks on the workers read the input and scatter it to key ranges under DST's temporary directory
    (batchtool.exchange), reduce tasks sort each range, and the shards are measured and written there in
    parallel (write_sorted); the driver plans, counts and writes the manifest. The same bytes and statistics
    as the local spill: the same keys, key ranges and order, batches cut from the same chunks, the same
    writer and shard boundaries."""
    started = time.perf_counter()
    report = ReadReport()
    reorder, units = _planned(op, plan, exchange.read_units(dataset), dataset, run.threads)
    if reorder is None:
        return None
    casts = output.casts(schema)
    stored = output.stored_schema(schema)
    workers = max(1, getattr(runner.active_engine(), "cpus", run.threads))
    with output_directory(dst, output.overwrite, read_paths(dataset)) as tmp:
        with exchange.workspace(tmp, dst) as directory:
            group, rows = _scatter_sorted(reorder, units, directory, dataset, dst, run, report, f"{command}: spill")
            with progress.bar(f"{command}: write", rows, quiet=run.quiet) as bar:
                kept = rows - (rows % reorder.batch_rows if reorder.drop_remainder else 0)
                batches = _Batches(group, dataset.schema, reorder.batch_rows, kept, output, stored)
                files = write_sorted(batches, tmp, directory, dst, MEASURES_PER_WORKER * workers, run.threads)
                bar.update(rows)
        manifest = write_manifest(tmp, command=command, options=options, seed=seed, dataset=dataset, dst=dst,
                                  output=output, schema=stored, casts=casts, files=files, rows_in=kept,
                                  rows_out=kept, stats=lambda: reorder.stats(rows), run=run, report=report,
                                  started=started)
    return JobResult(manifest, kept, kept)


__all__ = ["SortedCut", "SortedRegrouped", "regrouped_exchanged", "write_exchanged", "write_sorted"]
