"""Running one command end to end: work items -> the engine's workers -> batch shards + manifest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from batchtool import fs, progress
from batchtool import manifest as manifest_mod
from batchtool.dataset import Dataset, ReadReport, open_dataset
from batchtool.engines import check_engine, engine_summary
from batchtool.output import (BatchShardWriter, EncodedBatch, OutputOptions, check_destination, encode_batch,
                              output_directory, refuse_overlap)
from batchtool.runner import ordered_map

X = TypeVar("X")


@dataclass(frozen=True)
class RunSettings:
    """How to run, never what to compute: none of these may change output bytes."""

    threads: int = 1
    quiet: bool = False
    engine: str = "local"
    """Where per-item work runs: "local" threads or "ray" (see batchtool.engines)."""
    ray_address: str | None = None
    """An existing Ray cluster to connect to; None starts a local one with `threads` CPUs."""

    def __post_init__(self) -> None:
        check_engine(self.engine, self.ray_address)


@dataclass
class JobResult:
    manifest: dict[str, Any]
    rows_in: int
    rows_out: int
    extra: dict[str, Any] = field(default_factory=dict)


def write_job(*, command: str, options: dict[str, Any], seed: int | None, dataset: Dataset, dst: str,
              output: OutputOptions, schema: pa.Schema, items: Iterable[X],
              work: Callable[[X], tuple[list[pa.RecordBatch], int]], stats: Callable[[], dict[str, Any]],
              run: RunSettings, report: ReadReport | None = None, total_rows: int | None = None,
              desc: str | None = None, started: float | None = None) -> JobResult:
    """Apply `work` to items on the engine's workers (each returns output batches and the input rows
    it consumed), write the batches in item order here, then the manifest, then move the directory
    into place. The manifest's run.wall_seconds counts from `started` (default: now)."""
    started = time.perf_counter() if started is None else started
    rows_in = rows_out = 0
    casts = output.casts(schema)
    schema = output.stored_schema(schema)

    def encoded_work(item: X) -> tuple[list[EncodedBatch], int]:
        batches, consumed = work(item)
        return [encode_batch(b, output) for b in batches], consumed

    with output_directory(dst, output.overwrite, read_paths(dataset)) as tmp:
        writer = BatchShardWriter(tmp, schema, output, name=dst)
        results = ordered_map(encoded_work, items, run.threads)
        # closed, however the block ends, before the directories are removed: the items' source may
        # still be writing temporary files of its own (segment's key index) on the reader thread
        with progress.bar(desc or f"{command}: write", total_rows if total_rows is not None else dataset.progress_rows,
                          quiet=run.quiet) as bar, closing(results):
            for encoded, consumed in results:
                for batch in encoded:
                    writer.write(batch)
                    rows_out += batch.data.num_rows
                rows_in += consumed
                bar.update(consumed)
        files = writer.close()
        manifest = write_manifest(tmp, command=command, options=options, seed=seed, dataset=dataset, dst=dst,
                                  output=output, schema=schema, casts=casts, files=files, rows_in=rows_in,
                                  rows_out=rows_out, stats=stats, run=run, report=report, started=started)
    return JobResult(manifest, rows_in, rows_out)


def write_manifest(tmp: str, *, command: str, options: dict[str, Any], seed: int | None, dataset: Dataset,
                   dst: str, output: OutputOptions, schema: pa.Schema, casts: dict[str, str], files: list[dict],
                   rows_in: int, rows_out: int, stats: Callable[[], dict[str, Any]], run: RunSettings,
                   report: ReadReport | None, started: float) -> dict[str, Any]:
    """The manifest of a finished output in `tmp` (files written, by write_job here or by workers,
    see batchtool.exchange), written there; returns it."""
    job_stats = stats()
    if report is not None:
        job_stats.update(report.stats())
    manifest = manifest_mod.build(
        command=command, options=options, seed=seed, dataset=dataset, output=output, schema=schema,
        files=files, stats={"rows_in": rows_in, "rows_out": rows_out, **job_stats},
        run={"threads": run.threads, "engine": run.engine, **engine_summary(),
             "wall_seconds": round(time.perf_counter() - started, 3),
             "peak_rss_bytes": manifest_mod.peak_rss_bytes()})
    if casts:
        manifest["output"]["cast"] = casts
    with fs.write_errors(f"{dst}: cannot write the output"):
        manifest_mod.write(tmp, manifest)
    return manifest


def read_paths(dataset: Dataset) -> list[str]:
    """Every place a command reads: each shard, SRC when it is a directory, and the directory a glob
    lists when it reaches into subdirectories (what refuse_overlap keeps DST and the tmp dir out of)."""
    src = dataset.src
    root = fs.glob_root(src) if fs.is_glob(src) else src if fs.is_dir(src) else None
    return ([root] if root is not None else []) + [s.path for s in dataset.shards]


def open_source(src: str, dst: str, output: OutputOptions, *, tmp_dir: str | None = None,
                format: str | None = None, skip_corrupt: bool = False) -> Dataset:
    """open_dataset for a command that writes DST: before any pass runs or any file is made, refuse a DST
    or tmp dir that overlaps the input, and an existing DST without --overwrite (write_job checks DST
    again before it writes; this is so the user hears it at once)."""
    dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt)
    refuse_overlap(read_paths(dataset), {"DST": dst, "--tmp-dir": tmp_dir})
    check_destination(dst, output.overwrite)
    return dataset
