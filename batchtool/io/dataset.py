"""What a dataset is made of: its shards (input files), the chunks of rows read from them with stable ids and
where each row comes from, what reading skipped, and the Dataset a SRC opens as (batchtool.io.inputs opens it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from batchtool.core import rng
from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES
from batchtool.core.errors import CorruptRecordError, InputError, RowError, SchemaError, where
from batchtool.core.runner import SERIAL, Executor
from batchtool.io.formats import column_types


@dataclass(frozen=True)
class Shard:
    """One input file; `index` is its position in SRC's sorted file list and part of every example id."""

    index: int
    path: str
    size: int


@dataclass(frozen=True)
class Origin:
    """Where a chunk's rows come from: the file of each shard index its example ids hold, and what a file calls
    one of its rows (its format's `unit`: `row`, `record`)."""

    paths: Mapping[int, str]
    unit: str = "row"

    def merge(self, other: Origin | None) -> Origin:
        return self if other is None else Origin({**self.paths, **other.paths}, self.unit)


@dataclass(frozen=True)
class Chunk:
    """A slice of rows and their stable example ids (see rng.example_ids), and (when read from files) where they
    come from, so that a problem found at a row names the file and the row in it (`where`, `located`)."""

    data: pa.RecordBatch
    ids: np.ndarray
    origin: Origin | None = None

    @property
    def num_rows(self) -> int:
        return self.data.num_rows

    def take(self, indices: np.ndarray) -> Chunk:
        """Rows by position (repeats allowed), ids included."""
        indices = np.asarray(indices, dtype=np.int64)
        return Chunk(self.data.take(pa.array(indices)), self.ids[indices], self.origin)

    def filter(self, mask: np.ndarray) -> Chunk:
        mask = np.asarray(mask, dtype=bool)
        return Chunk(self.data.filter(pa.array(mask)), self.ids[mask], self.origin)

    @staticmethod
    def concat(chunks: Sequence[Chunk], schema: pa.Schema) -> Chunk:
        """One chunk of all rows; `schema` makes an empty list of chunks well-defined."""
        batches = pa.Table.from_batches([c.data for c in chunks], schema).combine_chunks().to_batches()
        data = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema)
        ids = np.concatenate([c.ids for c in chunks]) if chunks else np.zeros(0, dtype=np.uint64)
        origins = [c.origin for c in chunks if c.origin is not None]
        return Chunk(data, ids, functools.reduce(Origin.merge, origins[1:], origins[0]) if origins else None)

    def where(self, row: int) -> str:
        """'file, row N' of a row of this chunk; 'row N of a batch' when the chunk does not know its file."""
        example = int(self.ids[row])
        path = self.origin.paths.get(example >> rng.SHARD_BITS) if self.origin is not None else None
        return f"row {row} of a batch" if path is None else place(path, self.origin.unit, example)

    @contextmanager
    def located(self) -> Iterator[None]:
        """Around work on this chunk: a RowError (a row of its data) names the file and the row in it instead."""
        try:
            yield
        except RowError as exc:
            raise exc.at(self.where(exc.row)) from None


def place(path: str, unit: str, example_id: int) -> str:
    """'file, row N' of an example id whose shard is that file."""
    return f"{path}, {unit} {example_id & ((1 << rng.SHARD_BITS) - 1)}"


@dataclass(frozen=True)
class Skipped:
    """What --skip-corrupt dropped at one place of a file: the error, and exactly how much it cost.

    bytes counts the stream's bytes from the start of the bad record to the next record
    read (of the decompressed stream for GZIP files); records counts the records those
    bytes held, as far as their framing shows: at least one, except for a gzip stream cut
    short at a record boundary, which has nothing left to count.
    """

    error: CorruptRecordError
    records: int
    bytes: int


@dataclass
class ReadReport:
    """What reading had to skip (only with skip_corrupt); filled by the reader thread."""

    corrupt_records: int = 0
    corrupt_bytes: int = 0
    """Exact bytes skipped: of the files, or of the decompressed stream of GZIP files."""
    events: int = 0
    """Places where something was skipped (a cut-short gzip stream can cost 0 records and 0 bytes)."""
    first_errors: list[str] = field(default_factory=list)

    def record(self, skipped: Skipped) -> None:
        self.corrupt_records += skipped.records
        self.corrupt_bytes += skipped.bytes
        self.events += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(str(skipped.error))

    def merge(self, other: ReadReport) -> None:
        """Add another reader's report (readers of different shards, merged in shard order)."""
        self.corrupt_records += other.corrupt_records
        self.corrupt_bytes += other.corrupt_bytes
        self.events += other.events
        self.first_errors = (self.first_errors + other.first_errors)[:10]

    def stats(self) -> dict[str, Any]:
        """The manifest's account of what was skipped; empty when nothing was."""
        if not self.events:
            return {}
        return {"corrupt_records_skipped": self.corrupt_records, "corrupt_bytes_skipped": self.corrupt_bytes,
                "corrupt_record_errors": self.first_errors}

    def summary(self) -> str:
        """' (N corrupt records, B bytes skipped)' for a command's summary line; '' when nothing was."""
        if not self.events:
            return ""
        records = "1 corrupt record" if self.corrupt_records == 1 else f"{self.corrupt_records:,} corrupt records"
        return f" ({records}, {self.corrupt_bytes:,} bytes skipped)"


@dataclass(frozen=True)
class OneChunk:
    """A read task that is already worker-sized (a Parquet row group, an Arrow record batch) as a unit a worker
    reads whole (ShardFormat.units)."""

    task: Callable[[], Chunk]

    def __call__(self, report: ReadReport) -> Iterator[Chunk]:
        yield self.task()


class ShardFormat(Protocol):
    """The reading side of a shard format, as a Dataset and its readers use it (batchtool.io.formats.base.Format
    implements it; declared here, below the formats, which open datasets)."""

    name: ClassVar[str]
    label: ClassVar[str]
    unit: ClassVar[str]
    record_checksums: ClassVar[bool]
    self_indexing: ClassVar[bool]

    def tasks(self, dataset: Dataset, columns: list[str] | None,
              report: ReadReport) -> Iterator[Callable[[], Chunk]]: ...

    def recorded(self, dataset: Dataset) -> dict[str, Any]:
        """What a manifest records of how the dataset was read (its format's options), beside its format's name."""
        ...

    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int: ...

    def units(self, dataset: Dataset, columns: list[str] | None,
              report: ReadReport) -> Iterator[Callable[[ReadReport], Iterator[Chunk]]]:
        """The input as units the workers of a distributed pass read whole, in order (batchtool.exec.exchange)."""
        ...

    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, Any]:
        """Each file's batch count and where its batches are (a formats.base.StoredBatches)."""
        ...


@dataclass(frozen=True)
class Reading:
    """How inputs.open_dataset asks a format to read a SRC (Reader.open_dataset): the format's own options (its
    Reader.read_options, built from what the caller gave), what to do with damaged units, the limits on what one
    unit may take, and what runs a pass the opening needs (a schema scan)."""

    options: Any = None
    skip_corrupt: bool = False
    max_record_bytes: int | None = None
    """The largest unit read, and what one may decompress to without `memory` (None: DEFAULT_MAX_RECORD_BYTES)."""
    memory: int | None = None
    """The command's --memory, which bounds what one unit decompresses to instead."""
    executor: Executor = SERIAL

    @property
    def limits(self) -> dict[str, int]:
        """The limits as Dataset's fields take them (absent: the Dataset's defaults)."""
        return {k: v for k, v in (("max_record_bytes", self.max_record_bytes), ("memory", self.memory))
                if v is not None}


@dataclass(frozen=True)
class Dataset:
    """Resolved shards plus the schema every chunk is decoded to, and their format, which reads them."""

    src: str
    spec: ShardFormat
    """The format of the shards (batchtool.io.formats), whose read tasks `tasks` hands out."""
    shards: tuple[Shard, ...]
    schema: pa.Schema
    options: Any = None
    """The format's reading options as it resolved them opening the shards (its Reader.read_options dataclass;
    None for a format that has none), which its read tasks follow and its `recorded` gives manifests."""
    num_rows: int | None = None
    skip_corrupt: bool = False
    manifest: dict | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    memory: int | None = None
    """The command's --memory, which bounds what one unit of input decompresses to (None: --max-record-bytes does)."""

    @property
    def progress_rows(self) -> int | None:
        """Rows for a progress bar's total: what the files say (footers), else (files that do not count their rows)
        a batchtool manifest's. Only ever a bar's total: a manifest's number sizes nothing."""
        if self.num_rows is not None:
            return self.num_rows
        rows = (self.manifest or {}).get("output", {}).get("rows")
        return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def shard_of(self, example_id: int) -> Shard:
        return self.shards[int(example_id) >> rng.SHARD_BITS]

    def locate(self, example_id: int) -> str:
        """'file, row N' of an example id, for error messages."""
        return place(self.shard_of(example_id).path, self.spec.unit, int(example_id))

    @property
    def format(self) -> str:
        """The format's name: what --format and the manifest call it."""
        return self.spec.name

    def check_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """Fail early, listing what is available, when an asked column does not exist."""
        if columns is None:
            return None
        names = self.schema.names
        for name in columns:
            if name not in names:
                raise SchemaError(f"{self.src}: no column {name!r} (available: {', '.join(names)})")
        return list(dict.fromkeys(columns))

    def projected_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of these columns, in this order, with the schema's metadata (formats.column_meta)."""
        if columns is None:
            return self.schema
        return pa.schema([self.schema.field(c) for c in columns], metadata=self.schema.metadata)

    def tasks(self, columns: Sequence[str] | None = None,
              report: ReadReport | None = None) -> Iterator[Callable[[], Chunk]]:
        """Read tasks in a deterministic order; run them on any threads and keep their order.

        Each format cuts its files into tasks (Reader.tasks): a row group, a record batch, a byte range of
        records which the task reads, checks and decodes, so that on a cluster mostly paths and offsets
        travel to the workers.
        """
        cols = self.check_columns(columns)
        for f in self.projected_schema(cols):
            why = column_types.unsupported(f.type)
            if why is not None:
                raise SchemaError(f"{self.src}: column {f.name!r} is {column_types.shown_type(f)}: {why}; leave it out "
                                  "(convert --columns, select --columns)")
        yield from self.spec.tasks(self, cols, report or ReadReport())

    def chunks(self, columns: Sequence[str] | None = None, executor: Executor = SERIAL,
               report: ReadReport | None = None) -> Iterator[Chunk]:
        """All chunks in order, read and decoded on `executor`."""
        return executor.map(_run, self.tasks(columns, report))

    def parts(self, columns: Sequence[str] | None = None) -> list[Part]:
        """What reads these columns (checked), one format each: this dataset itself; a mix's sources
        (batchtool.io.mixed), each with what makes its chunks the mix's."""
        return [Part(self, self.check_columns(columns))]


@dataclass(frozen=True)
class Part:
    """One format's share of a dataset's input (Dataset.parts): the dataset that reads it, the columns to read, and
    what makes each chunk read the whole dataset's (None: as read); `name` is a mix's name for its source."""

    dataset: Dataset
    columns: list[str] | None
    adapt: Callable[[Chunk], Chunk] | None = None
    name: str | None = None


def _run(task: Callable[[], Chunk]) -> Chunk:
    return task()


def first_in_input(error: RowError, dataset: Dataset, executor: Executor = SERIAL) -> InputError | None:
    """For a RowError in a batch an operation made (its rows' ids are gone): the same problem at the first row of
    the input whose column holds it (error.refind), naming the file and the row; None when the input has no such
    column (an operation's own) or row. One pass over that column only."""
    if error.refind is None or error.column not in dataset.schema.names:
        return None
    for chunk in dataset.chunks([error.column], executor):
        row = error.refind(chunk.data.column(0))
        if row is not None:
            return error.at(dataset.locate(int(chunk.ids[row])), " (the first such row of the input)")
    return None


def shard_chunk(batch: pa.RecordBatch, schema: pa.Schema, shard: Shard, first_row: int, unit: str = "row") -> Chunk:
    """A batch read from a shard as a chunk of the dataset: in the dataset's schema (its field metadata included:
    what marks an extension type's storage), with its rows' ids and their file."""
    if not batch.schema.equals(schema, check_metadata=True):
        batch = _conform(batch, schema, shard.path)
    ids = rng.example_ids(shard.index, first_row, batch.num_rows)
    return Chunk(batch, ids, Origin({shard.index: shard.path}, unit))


def _conform(batch: pa.RecordBatch, schema: pa.Schema, path: str) -> pa.RecordBatch:
    """Cast a shard whose schema differs only in representation (e.g. large_string, an extension type's storage)
    to the dataset's."""
    if batch.schema.equals(schema):  # the metadata only; a batch of no columns keeps its rows
        return pa.RecordBatch.from_arrays(batch.columns, schema=schema) if len(schema) else batch.select([])
    try:
        return column_types.conform_read(batch, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise SchemaError(f"{where(path)}: schema differs from the first shard's ({exc})") from exc
