"""Writing a job's output, the one way every command, pipeline and convert writes: the output is produced in the
run's workspace (batchtool.io.workspace), written as batch shards, then the manifest, then moved into place.

What is produced (batchtool.exec.produced) is sorted batches any worker can read (ops.regroup.Cut) or a stream of
tasks making batches in order (Streamed); the executor places the writing once, by what its workers share
(runner.Shares.memory): workers that share the driver's memory make and encode the batches and one writer here
appends them in order; others spool and write the shards themselves (batchtool.exec.shards), cut where the one
writer would cut them.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import fs, progress
from batchtool.core.errors import OptionError
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor
from batchtool.core.tally import Tally
from batchtool.exec.exchange import ReadUnit
from batchtool.exec.job import JobResult, read_paths
from batchtool.exec.produced import Deferred, Emitted, Job, Produce, Produced, Streamed
from batchtool.exec.shards import Encoded, runs_of, stored_batches, write_on_workers
from batchtool.io import example_index, manifest as manifest_mod
from batchtool.io.example_index import CarriedWriter
from batchtool.io.dataset import ReadReport
from batchtool.io.formats.base import EncodedBatch
from batchtool.io.output import BatchShardWriter, OutputOptions, encode_batches, output_directory
from batchtool.io.workspace import Workspace, tasks_executor, workspace
from batchtool.ops.regroup import Cut, SortedBatches
from batchtool.ops.written import written_names

RUN_BYTES = 1 << 20
"""About the sorted bytes one task of the local writer reads and encodes (at least one batch), at least: a few such
runs wait for the writer at a time (the local engine's window), so this stays a small part of any budget."""
RUN_BYTES_MAX = 8 << 20
"""At most this, where --memory allows (run_bytes): every run reopens the sorted ranges it reads from files, and
with 1 MiB runs that cost bucket about a tenth of its writing (measured)."""
RUN_SHARE = 16
"""The runs in flight (the window: threads + 1), each held about three times over (sorted rows, padded, encoded),
take at most about 3/RUN_SHARE of --memory."""


def write(job: Job, produce: Produce, executor: Executor, report: ReadReport | None = None) -> JobResult:
    """Produce the job's output in a workspace, write it as batch shards in DST's temporary directory on the
    executor, then the manifest, and move the directory into place (output.output_directory: all or nothing)."""
    report = ReadReport() if report is None else report
    casts = job.output.casts(job.schema)
    stored = job.output.stored_schema(job.schema)
    key, carried = index_key(job), False  # carried: keep the ids the batches carry, to key the index by input row
    try:  # an unusable --key is refused before DST is touched
        if job.batches:
            carried = example_index.key_column(stored, key) is None
        elif job.output.key is not None:
            raise OptionError("key", "only batch output has an example index to key", value=repr(job.output.key))
    except OptionError as exc:
        raise exc.at(job.dst) from None
    with output_directory(job.dst, job.output.overwrite, read_paths(job.source)) as tmp, \
            workspace(job.dst, executor, job.run.tmp_dir, inside=tmp) as space, produce(space, report) as produced:
        tasks = tasks_executor(space, executor)
        output = job.output if produced.sequence_columns is None else \
            replace(job.output, sequence_columns=produced.sequence_columns)
        produced, output = _stacking(produced, output)
        job = replace(job, output=output)  # (what the manifest records: the stacks)
        stats = produced.stats
        placed = _write_on_driver if tasks.shares.memory else write_on_workers
        files, rows_in, rows, kept = placed(job, produced, output, stored, tmp, space, report, tasks, carried)
        manifest = write_manifest(tmp, space, job, casts, stored, files, rows_in, rows, report,
                                  stats if job.manifest_stats is None
                                  else functools.partial(_pipeline_stats, job.manifest_stats, stats, rows),
                                  executor.summary(), produced.padding if isinstance(produced, Cut) else None,
                                  key, example_index.Carried(kept, example_index.InputRows(
                                      job.source if job.numbered else None)) if carried else None)
    return JobResult(manifest, rows_in, rows)


def index_key(job: Job) -> str | None:
    """The column keying the example index of batch output: --key, else the column the op writes its examples' keys
    to, under the name --output-column gives it (segment's `key`), else None (example_index.key_column: `key` where
    the output has one, else input rows)."""
    if job.output.key is not None:
        return job.output.key
    recorded = json.loads(json.dumps({"command": job.command, "options": job.options}, default=str))  # as read back
    return written_names(recorded, job.dst).get(example_index.KEY_COLUMN)


def _pipeline_stats(manifest_stats: Callable[[dict[str, Any], int], dict[str, Any]],
                    stats: Callable[[], dict[str, Any]], rows: int) -> dict[str, Any]:
    return manifest_stats(stats(), rows)


def write_manifest(tmp: str, space: Workspace, job: Job, casts: dict[str, str], stored: pa.Schema, files: list[dict], rows_in: int,
                   rows_out: int, report: ReadReport, stats: Callable[[], dict[str, Any]],
                   executed: dict[str, Any], padding: dict[str, Any] | None = None, key: str | None = None,
                   carried: example_index.Carried | None = None) -> dict[str, Any]:
    """The manifest of a finished output in `tmp`, written there (with the example index of batch output, built in
    the workspace `space` under --memory, keyed by the column `key` (index_key), or by input row from the ids
    `carried` where no column keys it); returns it. Its run section (the one part that may differ between runs
    writing the same bytes) says how the run went (`executed`: the executor's summary); `padding`: how
    batchtool.load pads the batches (Cut.padding)."""
    job_stats = stats()
    job_stats.update(report.stats())
    manifest = manifest_mod.new_manifest(
        command=job.command, options=job.options, seed=job.seed, dataset=job.source, output=job.output.recorded(),
        schema=stored, files=files, stats={"rows_in": rows_in, "rows_out": rows_out, **job_stats},
        run={"threads": job.run.threads, "engine": job.run.engine, **executed,
             "wall_seconds": round(time.perf_counter() - job.started, 3),
             "peak_rss_bytes": manifest_mod.peak_rss_bytes()}, padding=padding)
    if casts:
        manifest["output"]["cast"] = casts
    with fs.write_errors(f"{job.dst}: cannot write the output"):
        if job.batches:
            manifest["output"]["index"] = example_index.build_index(tmp, manifest, space, job.run.budget, key, carried)
        manifest_mod.write_file(tmp, manifest)
    return manifest


# -- on the driver: one writer, in order, for workers that share its memory -----------------------------------


def _stacking(produced: Produced, output: OutputOptions) -> tuple[Produced, OutputOptions]:
    """Stacks of batches (Streamed.stacked_rows) written as they are made where the output format stores stacks,
    else cut into their batches where they are made."""
    if not isinstance(produced, Streamed) or produced.stacked_rows is None:
        return produced, output
    if output.spec.stores_stacks:
        return produced, replace(output, stacked_rows=produced.stacked_rows)
    return replace(produced, emitted=functools.partial(_unstacked, produced.emitted, produced.stacked_rows),
                   stacked_rows=None), output


def _unstacked(emitted: Emitted, rows: int, thing: Any) -> tuple[list[Deferred], Tally]:
    """`emitted`, each piece's stacks cut into their batches of `rows` rows."""
    made, stats = emitted(thing)
    return [functools.partial(_cut_piece, piece, rows) for piece in made], stats


def _cut_piece(piece: Deferred, rows: int) -> tuple[list[pa.RecordBatch], int]:
    stacks, consumed = piece()
    return [stack.slice(start, rows) for stack in stacks for start in range(0, stack.num_rows, rows)], consumed


def _write_on_driver(job: Job, produced: Produced, output: OutputOptions, stored: pa.Schema, tmp: str,
                     space: Workspace, report: ReadReport, tasks: Executor,
                     carried: bool = False) -> tuple[list[dict], int, int, tuple[str, ...]]:
    """The job's batches made and encoded on the executor's threads and appended in order by one writer here: its
    shards' manifest entries, the input rows, the rows written, and with `carried` where the example ids the
    batches carry were kept, in output order (a directory of the workspace)."""
    directory = os.path.join(space.directory, "examples")
    with space.errors():
        kept = CarriedWriter(directory, space.errors) if carried else None
    try:
        if isinstance(produced, Streamed):
            files, rows_in, rows = _write_streamed(job, produced, output, stored, tmp, report, tasks, kept)
        else:
            files = _write_in_order(job, produced.batches, output, stored, tmp, tasks, kept)
            rows_in = rows = produced.batches.rows
    finally:
        if kept is not None:
            kept.close()
    return files, rows_in, rows, (directory,) if carried else ()


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


def _made(output: OutputOptions, width: int,
          piece: Deferred) -> tuple[list[EncodedBatch], list[np.ndarray | None], int]:
    """A piece's second task on a local thread: its batches made and encoded, the example ids they carry, and the
    input rows they complete."""
    batches, consumed = piece()
    ids: list[np.ndarray | None] = []
    return list(encode_batches(stored_batches(batches, width, ids.append), output)), ids, consumed


def _write_streamed(job: Job, out: Streamed, output: OutputOptions, stored: pa.Schema, tmp: str,
                    report: ReadReport, tasks: Executor,
                    kept: CarriedWriter | None) -> tuple[list[dict], int, int]:
    """The units' tasks on the engine's threads (each unit's work, then each piece of it made and encoded), their
    batches appended in order by one writer here, the example ids they carry to `kept`."""
    rows_in = rows_out = 0
    total = out.total_rows if out.total_rows is not None else job.source.progress_rows

    def pieces() -> Iterator[Deferred]:  # on the second map's reader thread, in input order
        for made, stats, skipped in tasks.map(functools.partial(_pieces, out.emitted), out.units):
            if out.merge is not None:
                out.merge(stats)
            report.merge(skipped)
            yield from made

    results = tasks.map(functools.partial(_made, output, len(stored)), pieces())
    # closed, however the block ends, before the directories are removed: the units' source may still be writing
    # temporary files of its own on the reader thread
    with BatchShardWriter(tmp, stored, output, name=job.dst, overlap=tasks.threads > 1) as writer, \
            progress.bar(f"{job.name}: write", total, job.run.shown) as bar, closing(results):
        for encoded, ids, consumed in results:
            for batch in encoded:
                writer.write(batch)
                rows_out += batch.data.num_rows
            if kept is not None:
                for carried in ids:
                    kept.add(carried)
            rows_in += consumed
            bar.update(consumed)
    return writer.close(), rows_in, rows_out


def _encoded_run(batches: Encoded) -> tuple[list[EncodedBatch], list[np.ndarray | None]]:
    """A run's batches encoded, and the example ids they carry."""
    ids: list[np.ndarray | None] = []
    return list(batches(ids.append)), ids


def sized_runs(batches: SortedBatches, nbytes: int) -> list[tuple[int, int]]:
    """Runs of about `nbytes` of sorted batches each, at least one batch."""
    return runs_of(batches.count, max(1, int(nbytes * batches.count / max(1, batches.nbytes()))))


def run_bytes(run: RunSettings) -> int:
    """The sorted bytes of one run of the local writer: as large as the run's --memory allows for its threads'
    window, between RUN_BYTES and RUN_BYTES_MAX."""
    return max(RUN_BYTES, min(RUN_BYTES_MAX, run.budget // (RUN_SHARE * (run.threads + 1))))


def _write_in_order(job: Job, batches: SortedBatches, output: OutputOptions, stored: pa.Schema, tmp: str,
                    tasks: Executor, kept: CarriedWriter | None) -> list[dict]:
    """Sorted batches read and encoded in runs on the engine's threads, appended in order by one writer here, whose
    shards roll over as the batches come (output.ShardCutter); the example ids they carry to `kept`."""
    runs = [Encoded(batches.reader(start, end), output, stored)
            for start, end in sized_runs(batches, run_bytes(job.run))]
    with BatchShardWriter(tmp, stored, output, name=job.dst, overlap=tasks.threads > 1) as writer, \
            progress.bar(f"{job.name}: write", batches.rows, job.run.shown) as bar:
        for encoded, ids in tasks.map(_encoded_run, runs):
            for batch in encoded:
                writer.write(batch)
                bar.update(batch.data.num_rows)
            if kept is not None:
                for carried in ids:
                    kept.add(carried)
    return writer.close()


__all__ = ["RUN_BYTES", "index_key", "run_bytes", "sized_runs", "write", "write_manifest"]
