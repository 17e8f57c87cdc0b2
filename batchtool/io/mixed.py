"""Several SRCs read as one dataset (what `mix` reads): each source read by its own format, its shards numbered after
the sources' before it (so example ids stay (shard, row) and an error still names the file and the row), every chunk
with a column saying which source it comes from."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from batchtool.core import fs, rng
from batchtool.io.dataset import Chunk, Dataset, Part, ReadReport, Shard, place
from batchtool.core.errors import InputError, OptionError, OptionSchemaError
from batchtool.io.formats import column_meta
from batchtool.io.formats.base import rows_only
from batchtool.io.formats.column_types import same_type, shown_type
from batchtool.io.mix_source import SOURCE

SOURCE_TYPE = pa.int32()


@dataclass(frozen=True)
class MixSource:
    """One SRC of a mix: its index (its rows' value in the source column), its name, and its dataset, whose shards
    are numbered after the sources' before it."""

    index: int
    name: str
    dataset: Dataset

    @property
    def label(self) -> str:
        """How a message names it: `source 'en' (data/en)`."""
        return f"source {self.name!r} ({self.dataset.src})"


@dataclass(frozen=True)
class Tag:
    """A source's chunk as the mix's: its columns in the mix's order and types, and the source column."""

    column: str
    index: int
    schema: pa.Schema
    """The mix's schema of the columns read."""

    def __call__(self, chunk: Chunk) -> Chunk:
        rows = chunk.num_rows
        if not len(self.schema):
            return Chunk(rows_only(rows), chunk.ids, chunk.origin)
        arrays = []
        for f in self.schema:
            if f.name == self.column:
                arrays.append(pa.array(np.full(rows, self.index, dtype=np.int32), SOURCE_TYPE))
                continue
            array = chunk.data.column(f.name)
            arrays.append(array if str(array.type) == str(f.type) else array.cast(f.type))  # a list's field name
        return Chunk(pa.RecordBatch.from_arrays(arrays, schema=self.schema), chunk.ids, chunk.origin)


@dataclass(frozen=True)
class _Adapted:
    """A read task of a source whose chunk becomes the mix's where the task runs."""

    task: Callable[[], Chunk]
    adapt: Callable[[Chunk], Chunk]

    def __call__(self) -> Chunk:
        return self.adapt(self.task())


@dataclass(frozen=True)
class MixedDataset(Dataset):
    """The sources' shards in source order as one dataset, its schema the first source's columns (in its order) and
    the source column; every source holds those columns with the same types. What metadata says of the data is
    kept where every source says it alike (formats.column_meta.shared)."""

    sources: tuple[MixSource, ...] = ()
    column: str = SOURCE
    selected: tuple[str, ...] | None = None
    """The columns kept of every source (--columns); None: all."""

    @property
    def format(self) -> str:
        """The sources' formats: `parquet`, or `parquet+arrow` for a mix of formats."""
        return "+".join(dict.fromkeys(s.dataset.format for s in self.sources))

    def parts(self, columns: Sequence[str] | None = None) -> list[Part]:
        """Each source, reading the asked columns it holds, its chunks tagged with its index."""
        schema = self.projected_schema(self.check_columns(columns))
        read = [name for name in schema.names if name != self.column]
        return [Part(s.dataset, read, Tag(self.column, s.index, schema), s.name) for s in self.sources]

    def tasks(self, columns: Sequence[str] | None = None,
              report: ReadReport | None = None) -> Iterator[Callable[[], Chunk]]:
        """Every source's read tasks in source order, each read by its own format."""
        report = report or ReadReport()
        for part in self.parts(columns):
            for task in part.dataset.tasks(part.columns, report):
                yield _Adapted(task, part.adapt)

    def source_of(self, example_id: int) -> MixSource:
        shard = int(example_id) >> rng.SHARD_BITS
        return next(s for s in reversed(self.sources) if s.dataset.shards and s.dataset.shards[0].index <= shard)

    def locate(self, example_id: int) -> str:
        """'file, row N' (or 'record N') of an example id, as its source's format calls a row."""
        return place(self.shard_of(example_id).path, self.source_of(example_id).dataset.spec.unit, int(example_id))


def source_names(srcs: Sequence[str], given: Sequence[str] = ()) -> tuple[str, ...]:
    """The sources' names: as given (one per source), else each SRC's last path component."""
    if given:
        if len(given) != len(srcs):
            raise OptionError("names", f"{len(given)} names for {len(srcs)} sources", value=",".join(given))
        return tuple(given)
    return tuple(posixpath.basename(src.rstrip("/\\").replace("\\", "/")) or src for src in srcs)


def mix_datasets(datasets: Sequence[Dataset], names: Sequence[str], column: str = SOURCE,
                 columns: Sequence[str] | None = None) -> MixedDataset:
    """The datasets as one (each read by its own format): no file in two of them, the same columns with the same types
    in each (after `columns`), the source column (`column`, which none of them has) added."""
    own = [MixSource(i, name, d) for i, (name, d) in enumerate(zip(names, datasets))]
    empty = next((s for s in own if s.dataset.num_rows == 0), None)
    if empty is not None:  # known without a pass (footers); the plan finds an empty source of uncounted rows
        raise InputError(f"{empty.label} is empty: it has no rows to mix")
    _refuse_shared_files(own)
    schemas = [s.dataset.projected_schema(s.dataset.check_columns(columns)) for s in own]
    _check_schemas(own, schemas)
    assert column not in schemas[0].names, "the caller refuses a source column the sources already have"
    sources, shards = [], []
    for source in own:
        renumbered = tuple(Shard(len(shards) + s.index, s.path, s.size) for s in source.dataset.shards)
        shards += renumbered
        sources.append(replace(source, dataset=replace(source.dataset, shards=renumbered)))
    rows = [d.num_rows for d in datasets]
    first = datasets[0]
    return MixedDataset(" + ".join(d.src for d in datasets), first.spec, tuple(shards),
                        column_meta.shared(schemas).append(pa.field(column, SOURCE_TYPE)),
                        num_rows=None if None in rows else sum(rows),  # type: ignore[arg-type]
                        skip_corrupt=first.skip_corrupt, max_record_bytes=first.max_record_bytes, memory=first.memory,
                        sources=tuple(sources), column=column, selected=None if columns is None else tuple(columns))


def _refuse_shared_files(sources: Sequence[MixSource]) -> None:
    """Sources may not overlap: a file in two of them would be mixed twice, under two weights."""
    seen: dict[tuple, tuple[str, MixSource]] = {}
    for source in sources:
        for shard in source.dataset.shards:
            ident = fs.identity(shard.path)
            if ident in seen and seen[ident][1] is not source:
                path, other = seen[ident]
                raise InputError(f"{path} is in {other.label} and in {source.label}"
                                 + (f" (as {shard.path})" if shard.path != path else "")
                                 + ": sources may not overlap, each file belongs to one")
            seen.setdefault(ident, (shard.path, source))


def _check_schemas(sources: Sequence[MixSource], schemas: Sequence[pa.Schema]) -> None:
    """Every source has the first one's columns with the same types, and no other (their order may differ)."""
    first, expected = sources[0], schemas[0]
    for source, schema in zip(sources[1:], schemas[1:]):
        for f in expected:
            if f.name not in schema.names:
                raise OptionSchemaError("columns", f"{source.label} has no column {f.name!r} ({first.label} has it: "
                                        f"{shown_type(f)}); give the sources the same columns, or keep only the ones "
                                        "they share with {columns}")
            other = schema.field(f.name)
            if not same_type(f, other):
                raise OptionSchemaError("columns", f"{source.label}: column {f.name!r} is {shown_type(other)}, but "
                                        f"{first.label} has {shown_type(f)}; give the sources the same types "
                                        "(e.g. rewrite one with `batchtool convert`), or leave the column out with "
                                        "{columns}")
        extra = next((name for name in schema.names if name not in expected.names), None)
        if extra is not None:
            raise OptionSchemaError("columns", f"{source.label} has a column {extra!r} that {first.label} lacks; give "
                                    "the sources the same columns, or keep only the ones they share with {columns}")


__all__ = ["SOURCE", "SOURCE_TYPE", "MixedDataset", "MixSource", "Tag", "mix_datasets", "source_names"]
