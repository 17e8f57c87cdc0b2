"""`convert`: rewrite a dataset in another shard format, unchanged row for row."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from batchtool import exchange, spool
from batchtool.dataset import Chunk, ReadReport
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.base import Tally
from batchtool.output import OutputOptions


@with_engine
def convert(src: str, dst: str, output: OutputOptions, *, columns: Sequence[str] | None = None,
            format: str | None = None, skip_corrupt: bool = False, run: RunSettings = RunSettings()) -> JobResult:
    """Read SRC's shards in order and write them to DST, with the manifest."""
    dataset = open_source(src, dst, output, format=format, skip_corrupt=skip_corrupt)
    cols = dataset.check_columns(columns)
    schema = dataset.projected_schema(cols)
    report = ReadReport()
    job = dict(command="convert", options={"columns": cols, "to": output.format, "compression": output.codec,
                                           "shard_rows": output.shard_rows, "shard_bytes": output.shard_bytes},
               seed=None, dataset=dataset, dst=dst, output=output, schema=schema, stats=dict, run=run, report=report)
    checked = functools.partial(_checked, output)
    if spool.applies(dst):  # on the workers: no row through the driver
        emitted = functools.partial(_spooled, checked)
        return spool.write_spooled(exchange.read_units(dataset, report, cols), emitted, Tally().merge, **job)

    def work(task: Callable[[], Chunk]) -> tuple[list[pa.RecordBatch], int]:
        chunk = checked(task())
        return [chunk.data], chunk.num_rows

    return write_job(items=dataset.tasks(cols, report), work=work, **job)



def _checked(output: OutputOptions, chunk: Chunk) -> Chunk:
    """The chunk, once its values are known to be writable in the output format: a value the format cannot hold
    is an error naming the file and the row in it, found here where the rows are known (Chunk.located)."""
    with chunk.located():
        output.spec.check_values(chunk.data, output)
    return chunk


def _spooled(checked: Callable[[Chunk], Chunk], chunk: Chunk) -> tuple[Any, Tally]:
    return spool.as_is(checked(chunk))
