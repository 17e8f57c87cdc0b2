"""A JSON Lines reader as docs/internals.md's new-format walkthrough writes one: a whole input format in one module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.json as pj

from batchtool.core.errors import InputError
from batchtool.io.dataset import Chunk, Dataset, Reading, ReadReport, Shard, shard_chunk
from batchtool.io.formats.base import DAMAGED, Reader, schema_problem


def _read(path: str, schema: pa.Schema | None = None) -> pa.Table:
    """The file's rows (as `schema` when given); one line naming the file when it is not JSON Lines."""
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error") if schema else None
    try:
        return pj.read_json(path, parse_options=options)
    except DAMAGED as exc:
        raise InputError(f"{path}: not JSON Lines ({exc})") from None


@dataclass(frozen=True)
class _Task:
    """One whole file, parsed where the task runs."""

    shard: Shard
    schema: pa.Schema
    """The dataset's schema, projected on the columns read."""
    parsed: pa.Schema
    """The dataset's whole schema, what every line is parsed as."""

    def __call__(self) -> Chunk:
        table = _read(self.shard.path, self.parsed).select(self.schema.names).combine_chunks()
        batches = table.to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
        return shard_chunk(batch, self.schema, self.shard, 0)


class JsonLinesReader(Reader):
    """Files of one JSON object per line; the first file's inferred schema is every file's."""

    name = "jsonl"
    label = "JSON Lines"
    suffixes = (".jsonl",)

    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: Reading) -> Dataset:
        if schema is None:
            schema = _read(shards[0].path).schema
        for shard in shards:
            if (problem := schema_problem(_read(shard.path).schema, schema)) is not None:
                raise InputError(f"{shard.path}: schema differs from {shards[0].path}: {problem}")
        return Dataset(src, self, shards, schema, manifest=manifest, skip_corrupt=reading.skip_corrupt,
                       **reading.limits)

    def tasks(self, dataset: Dataset, columns: list[str] | None, report: ReadReport) -> Iterator[_Task]:
        schema = dataset.projected_schema(columns)
        return (_Task(shard, schema, dataset.schema) for shard in dataset.shards)

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        return _read(shard.path, dataset.schema).num_rows
