"""`convert`: rewrite a dataset in another shard format, unchanged row for row."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager

import pyarrow as pa

from batchtool.exec import exchange
from batchtool.io.dataset import Chunk, ReadReport
from batchtool.exec.engines import executor as run_executor
from batchtool.core.run_settings import RunSettings
from batchtool.exec.job import JobResult, open_source
from batchtool.core.tally import Tally
from batchtool.io.output import OutputOptions
from batchtool.io.workspace import Workspace, tasks_executor
from batchtool.exec.produced import Deferred, Job, Streamed
from batchtool.exec.write import write


def convert(src: str, dst: str, output: OutputOptions, *, columns: Sequence[str] | None = None,
            format: str | None = None, skip_corrupt: bool = False, run: RunSettings = RunSettings()) -> JobResult:
    """Read SRC's shards in order and write them to DST, with the manifest, on the run's executor."""
    with run_executor(run) as executor:
        dataset = open_source(src, dst, output, run, executor, format=format, skip_corrupt=skip_corrupt)
        cols = dataset.check_columns(columns)
        job = Job("convert", {"columns": cols, "to": output.format, "compression": output.codec,
                              "shard_rows": output.shard_rows, "shard_bytes": output.shard_bytes},
                  None, dataset, dst, output, dataset.projected_schema(cols), run)

        def produce(space: Workspace, report: ReadReport) -> AbstractContextManager[Streamed]:
            units = exchange.units(dataset, report, tasks_executor(space, executor), cols)
            return contextlib.nullcontext(Streamed(units, functools.partial(_as_is, output), dict))

        return write(job, produce, executor)


def _as_is(output: OutputOptions, chunk: Chunk) -> tuple[list[Deferred], Tally]:
    """convert's work: the chunk, one row group (even empty), once its values are known to be writable in the
    output format: a value the format cannot hold is an error naming the file and the row in it, found here where
    the rows are known (Chunk.located)."""
    with chunk.located():
        output.spec.check_values(chunk.data, output)
    return [functools.partial(_whole, chunk)], Tally()


def _whole(chunk: Chunk) -> tuple[list[pa.RecordBatch], int]:
    return [chunk.data], chunk.num_rows
