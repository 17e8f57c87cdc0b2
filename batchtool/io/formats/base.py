"""The contract every shard format meets, so the writer, the readers and the options ask a format, not its name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from batchtool.core import budget
from batchtool.core.options import build_options, fields
from batchtool.io.dataset import Dataset, OneChunk, Reading
from batchtool.core.errors import InputError, OptionError, OptionInputError, SchemaError
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.io.formats.declared import RECORDED_OPTIONS

if TYPE_CHECKING:
    from batchtool.io.formats.declared import Declared
    from batchtool.io.dataset import Chunk, ReadReport, Shard


DAMAGED = (ValueError, OSError, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowIndexError, pa.ArrowKeyError,
           pa.ArrowSerializationError)
"""What pyarrow raises reading a damaged or unexpected file (pa.ArrowInvalid is a ValueError; so is a column name
that is not UTF-8; an unknown codec is not implemented): the readers turn it into one line naming the file."""

class WriteOptions(Protocol):
    """What a format reads of the options it writes with (output.OutputOptions implements them; declared here,
    below the output module, which asks the formats)."""

    compression: str | None
    writing: Any
    """The format's write options (its Writer.write_options dataclass; None where it has none)."""
    sequence_columns: tuple[str, ...] | None
    stacked_rows: int | None

    @property
    def codec(self) -> str: ...

    def narrowed_schema(self, schema: pa.Schema) -> pa.Schema: ...


BATCH_COLUMN = "batch"
"""The column bucket, segment and pack write: each row's batch number (in TFRecord output, what cuts the
records into batches for tf.data and for outputs of batchtool 0.1, which had no batch index)."""


@dataclass(frozen=True)
class EncodedBatch:
    """A batch ready for the writer: the Arrow data, plus framed bytes when the format encodes on workers, or the
    metadata its writer stores with it (computed on the workers, so the one writer only appends)."""

    data: pa.RecordBatch
    framed: bytes | None = None
    metadata: dict[bytes, bytes] | None = None


def rows_only(rows: int) -> pa.RecordBatch:
    """A batch of `rows` rows and no columns: what a read of no columns gives (only rows are counted)."""
    return pa.RecordBatch.from_arrays([pa.nulls(rows)], names=["_"]).select([])


ROW_ID_BYTES = 8
"""What reading a row costs besides its data: its example id (rng.example_ids), however narrow the row."""


def check_batch_memory(dataset: Dataset, inflated: int, rows: int, where: str, decoded: int = 0) -> None:
    """Stop before reading one unit of a file (a record batch, named by `where`) whose declared sizes the command's
    budget does not allow: `inflated` bytes its buffers decompress to, `decoded` bytes its dictionary-encoded
    columns take decoded, and a row id for each of its `rows`. Checked against --memory's share for one allocation
    (batchtool.core.budget) where the command has --memory, else --max-record-bytes, which every reading command has.
    A few bytes of a file can claim gigabytes (a compressed buffer's length, a row count, a dictionary entry
    repeated): the claim is checked, not the file's size."""
    need = inflated + decoded + ROW_ID_BYTES * rows
    what = " and ".join(w for w, n in (("its buffers decompressed", inflated), ("its dictionaries decoded", decoded))
                        if n) or "no decompression"
    if dataset.memory is not None:
        budget.check_fits("memory", f"reading it ({what}, {rows:,} row ids)", need, dataset.memory,
                          "give a larger {memory}, or write the file in smaller record batches", where=f"{where}: ",
                          error=OptionInputError)
    elif need > dataset.max_record_bytes:
        raise OptionInputError("max_record_bytes", f"reading it ({what}, {rows:,} row ids) takes {need:,} bytes, "
                                                   f"more than the limit of {dataset.max_record_bytes:,} "
                                                   "({max_record_bytes}); raise {max_record_bytes} if the data is "
                                                   "genuine, or write the file in smaller record batches",
                               where=f"{where}: ")


def schema_problem(found: pa.Schema, expected: pa.Schema) -> str | None:
    """How a file's schema differs from the one expected (metadata aside); None when it does not."""
    found = found.remove_metadata()
    return None if found.equals(expected.remove_metadata()) else _schema_diff(expected, found)


def _schema_diff(expected: pa.Schema, found: pa.Schema) -> str:
    for f in expected:
        if f.name not in found.names:
            return f"column {f.name!r} missing"
        if not found.field(f.name).type.equals(f.type):
            return f"column {f.name!r} is {found.field(f.name).type}, expected {f.type}"
    extra = [n for n in found.names if n not in expected.names]
    return f"extra columns {extra}" if extra else "column order differs"


def open_self_describing(src: str, format: Reader, shards: tuple[Shard, ...], schema: pa.Schema | None,
                         manifest: dict | None, footer: Callable[[str], tuple[pa.Schema, int]],
                         reading: Reading = Reading()) -> Dataset:
    """A Dataset of shards that each record their schema and rows (Parquet, Arrow IPC; `footer` reads them):
    every shard must have the first one's schema. `reading`: open_dataset's reader settings (the limits)."""
    rows = 0
    first_schema = None
    for shard in shards:
        if shard.size == 0:
            raise InputError(f"{shard.path}: empty file (0 bytes), not a valid {format.label} file")
        file_schema, file_rows = footer(shard.path)
        rows += file_rows
        if first_schema is None:
            first_schema = file_schema
        elif (problem := schema_problem(file_schema, first_schema)) is not None:
            raise SchemaError(f"{shard.path}: schema differs from {shards[0].path}: {problem}")
    return Dataset(src, format, shards, schema or first_schema, num_rows=rows, manifest=manifest,
                   skip_corrupt=reading.skip_corrupt, **reading.limits)


def size_problem(path: str, size: int, listed: int) -> str | None:
    """Why a file of `size` bytes cannot be the one its manifest lists at `listed` bytes (it is shorter: reading
    what the manifest promises would run past its end); None when it may be. A file changed otherwise is the
    `checksums` rule's to tell (`batchtool check`)."""
    if size >= listed:
        return None
    return f"{path}: {size:,} bytes, but {MANIFEST_NAME} says {listed:,} (truncated since it was written)"


class ShardSink(Protocol):
    """One output file being written: append batches, then close (returning the manifest entry's extra fields)."""

    def write(self, encoded: EncodedBatch) -> None: ...

    def close(self) -> dict:
        """Finish the file; the fields the format adds to its manifest entry (e.g. a batch index)."""

    def abandon(self) -> None:
        """Close any encoder into the already abandoned file (cannot fail)."""


@dataclass(frozen=True)
class Stacked:
    """Batch `index` of `stack`, a record batch holding consecutive batches of `rows` rows each (an output written
    with stacked batches: OutputOptions.stacked_rows): what a read gives of it, so that `batchtool.load` makes the
    stack's arrays once and slices them, instead of paying a batch's fixed costs once per batch."""

    stack: pa.RecordBatch
    index: int
    rows: int
    origin: object = None
    """What read it (an open file), kept alive with the stack: the same origin and `record` are the same stack,
    whichever read gave it, so its arrays are made once (None: only this very stack object)."""
    record: int = 0
    """The stack's record batch in its file."""

    def same_stack(self, other: Stacked) -> bool:
        return self.stack is other.stack or (self.origin is not None and self.origin is other.origin
                                              and self.record == other.record)

    @property
    def batch(self) -> pa.RecordBatch:
        return self.stack.slice(self.index * self.rows, self.rows)


Piece = pa.RecordBatch | Stacked
"""One batch as a read gives it."""


def batch_of(piece: Piece) -> pa.RecordBatch:
    """The batch a read gave, as a record batch (a slice of its stack)."""
    return piece.batch if isinstance(piece, Stacked) else piece


class ReadTask(ABC):
    """A read of some batches of one file (StoredBatches.read), run on any thread."""

    @abstractmethod
    def __call__(self) -> list[Piece]: ...

    def check(self) -> None:
        """Run on the consuming thread before each batch this task read is handed out: an InputError if they can
        no longer be touched safely (Arrow IPC: the memory-mapped file has shrunk since, where a read would be
        SIGBUS). Nothing to check for batches decoded into memory."""


class StoredBatches(ABC):
    """Where each batch of each output file is, in one format, and the task reading a run of them: what lets
    `batchtool.load` read any batch directly. `cache` is the reading generator's: what it keeps open for one
    block of files (footers, open files)."""

    records_buckets: ClassVar[bool] = False
    """The files' metadata give each batch's `bucket` (Parquet column statistics), so buckets() reads no data."""
    unsliced: ClassVar[bool] = False
    """Every array of a batch read, children included, starts at offset 0 of its buffers (Arrow IPC, whose format
    has no offsets): load makes the arrays from the batch's buffers alone (arrays.views)."""

    @abstractmethod
    def rows(self, f: int, local: np.ndarray) -> np.ndarray:
        """Rows of file f's batches `local`, reading no data (Arrow: batch headers; compressed, decompressing)."""

    @abstractmethod
    def read(self, f: int, local: np.ndarray, columns: list[str] | None, schema: pa.Schema,
             cache: dict, verify: bool = False) -> ReadTask:
        """The task (any thread may run it) reading file f's batches `local`: `columns`, as `schema`; `verify`:
        also each batch's checksum where the format only checks it when asked (Arrow IPC's CRC32C)."""

    def buckets(self, f: int, local: np.ndarray, column: str = "bucket") -> np.ndarray:
        """The bucket of each batch (in `column`, bucket's `bucket`) from the files' metadata, -1 where they give
        no single value (everywhere unless records_buckets)."""
        return np.full(len(local), -1, dtype=np.int64)

    def unshuffled(self) -> str | None:
        """Why the batches can only be read in file order, as load's error goes on after 'DST is'; None: any
        order."""
        return None

    def unverifiable(self) -> str | None:
        """Why `verify=True` cannot check these files' batches, as load's error goes on after 'verify=True:';
        None: it can (Parquet pages and TFRecord records carry checksums every read verifies)."""
        return None

    def in_place(self, verify: bool = False) -> bool:
        """Whether a read decodes nothing (Arrow IPC without compression, memory-mapped: its batches are views of
        the map): load then reads on the consuming thread, as handing such a read to a thread costs more than the
        read (Python holding the GIL either way). With `verify`, whether that holds with each batch's CRC32C
        computed on the read too."""
        return False

    def release(self, cache: dict) -> None:
        """Drop (and close) what a block kept."""
        cache.clear()


def cut(batch: pa.RecordBatch, rows: list[int]) -> list[pa.RecordBatch]:
    """Several batches decoded in one call cut back into batches of `rows` rows each."""
    starts = np.cumsum([0, *rows])
    return [batch.slice(int(s), r) for s, r in zip(starts, rows)]


def declared_options(options: type | None, given: Mapping[str, Any]) -> Any:
    """The options dataclass `options` (None: a format without options) built from the values of `given` it
    declares (None values: its defaults)."""
    if options is None:
        return None
    names = {f.name for f, _ in fields(options)}
    return build_options(options, {k: v for k, v in given.items() if k in names and v is not None})


class Reader(ABC):
    """What reads a format's files as a Dataset: how they are recognised, opened and cut into read tasks. A format
    only read (an input) is a Reader alone, listed in batchtool.io.formats.registry."""

    name: ClassVar[str]
    """What --format and the manifest call it: 'parquet'."""
    label: ClassVar[str]
    """How messages name it: 'Parquet'."""
    suffixes: ClassVar[tuple[str, ...]]
    """The file name endings that say a file is of this format (lower case)."""
    magic: ClassVar[bytes | None] = None
    """The bytes a file of this format starts with, to recognise a file whose name says nothing."""
    unit: ClassVar[str] = "row"
    """What an error calls one example of a file of this format ('row' or 'record')."""
    record_checksums: ClassVar[bool] = False
    """Each record carries its own checksum, which the `crc` rule of `check` verifies."""
    writes: ClassVar[bool] = False
    """A Format (--to may name it), not a Reader alone (io/formats/declared.py's Declared.writes)."""
    self_indexing: ClassVar[bool] = True
    """A file's batches can be found from the file alone (row groups, record batches); False: only from the
    batch index in the manifest batchtool writes beside the files."""

    def __init_subclass__(cls, declared: Declared | None = None, **kwargs: Any) -> None:
        """`class ParquetFormat(Format, declared=DECLARED["parquet"])`: its name, label, codecs, ... from its
        declaration (io/formats/declared.py), which --help reads without importing this module."""
        super().__init_subclass__(**kwargs)
        if declared is not None:
            for name in ("name", "label", "suffixes", "codecs", "default_codec", "record_checksums", "float32_only",
                         "write_options"):
                setattr(cls, name, getattr(declared, name))

    def detect(self, path: str, head: bytes | None = None) -> bool:
        """By the file name, or (given the file's first bytes) by its magic number."""
        if path.lower().endswith(self.suffixes):
            return True
        return head is not None and self.magic is not None and head.startswith(self.magic)

    read_options: ClassVar[type | None] = None
    """The dataclass of the options reading this format takes, each declared with core.options.option (as an op's
    are); None: it takes none."""

    def options_of(self, given: Mapping[str, Any]) -> Any:
        """This format's reading options from {name: value} (what open_dataset was given, or what a manifest
        recorded: names of other formats' options are left out, None values too)."""
        return declared_options(self.read_options, given)

    def recorded(self, dataset: Dataset) -> dict[str, Any]:
        """What a manifest records of how `dataset` was read: every name of RECORDED_OPTIONS, with the value of this
        format's option of that name (None where it has none)."""
        return {name: getattr(dataset.options, name, None) for name in RECORDED_OPTIONS}

    def directory_files(self, src: str) -> list[str] | None:
        """The data files of directory `src` in their order, when it is a dataset this format's own metadata
        describes (a Hugging Face save_to_disk directory); None otherwise, and SRC's files are found by name."""
        return None

    @abstractmethod
    def open_dataset(self, src: str, shards: tuple[Shard, ...], schema: pa.Schema | None, manifest: dict | None,
                     reading: Reading) -> Dataset:
        """The Dataset of these shards: their common schema (or `schema`), checked, read under `reading`."""

    @abstractmethod
    def tasks(self, dataset: Dataset, columns: list[str] | None,
              report: ReadReport) -> Iterator[Callable[[], Chunk]]:
        """Read tasks over every shard, in a deterministic order; any thread may run them."""

    @abstractmethod
    def count_rows(self, dataset: Dataset, shard: Shard, report: ReadReport) -> int:
        """Rows of one shard, decoding none where the file says (check's row count when no rule reads data); what
        a damaged file loses is told to `report`."""

    def units(self, dataset: Dataset, columns: list[str] | None,
              report: ReadReport) -> Iterator[Callable[[ReadReport], Iterator[Chunk]]]:
        """The input as units the workers of a distributed pass read whole, in order (batchtool.exec.exchange): each
        read task, by default; a format whose files must be read from their start overrides it. What a unit
        skips goes to the report it is called with; `report` gets what this call's own passes skip."""
        return map(OneChunk, dataset.tasks(columns, report))


class Writer(ABC):
    """What writes a format's shards (--to): its codecs and options' checks, the encoder workers run, the sink."""

    label: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    """(Declared by the Reader: a Writer is one part of a Format.)"""
    write_options: ClassVar[type | None] = None
    """The dataclass of the options writing this format takes (each field declared with core.options.option: the
    commands that write take it as a flag, a pipeline's [output] as a key); None: it takes none."""

    def writing_of(self, given: Mapping[str, Any]) -> Any:
        """This format's write options from {name: value} (names of other formats' options left out)."""
        return declared_options(self.write_options, given)

    codecs: ClassVar[tuple[str, ...]]
    """What --compression may ask of it."""
    default_codec: ClassVar[str]
    """The codec without --compression."""
    max_shard_batches: ClassVar[int | None] = None
    stores_stacks: ClassVar[bool] = False
    """It stores stacked batches as they come (OutputOptions.stacked_rows: one stored unit holding several
    batches of equal rows, which its reader cuts back); a format that does not gets each batch apart."""
    """Batches per shard at most, whatever its size (None: no limit)."""
    float32_only: ClassVar[str | None] = None
    """Why it holds floats as float32 only (what a message says: the API holding them), so float64 columns need
    `--cast float64=float32` (see OutputOptions); None: it holds every float."""
    group: ClassVar[str | None] = None
    """What the summary calls one stored batch of an output that is rows, not batches ('row group', 'record batch');
    None: nothing a reader of the file sees (the records of a stream follow each other)."""

    def suffix(self, codec: str) -> str:
        """The suffix of output shards written with `codec`."""
        return self.suffixes[0]

    def check_options(self, options: WriteOptions) -> None:
        """OptionError naming the option, the value and what is allowed."""
        if options.codec not in self.codecs:
            raise OptionError("compression", f"{{compression}} {options.compression!r}: "
                                             f"{self.label} takes {', '.join(self.codecs)}")

    def recorded_output(self, options: WriteOptions) -> dict[str, Any]:
        """What the manifest's output section records for readers of the files (RECORDED_OPTIONS: None where the
        files describe themselves)."""
        return dict.fromkeys(RECORDED_OPTIONS)

    def encode(self, batch: pa.RecordBatch, options: WriteOptions) -> EncodedBatch:
        """Pure and thread-safe (workers run it): by default the writer encodes the Arrow data itself."""
        return EncodedBatch(batch)

    def encode_many(self, batches: Sequence[pa.RecordBatch], options: WriteOptions) -> list[EncodedBatch]:
        """encode of each batch, in order: a format whose per-call cost outweighs its per-byte cost on small
        batches (many batches of a few rows) encodes them together."""
        return [self.encode(batch, options) for batch in batches]

    def check_values(self, batch: pa.RecordBatch, options: WriteOptions) -> None:
        """What encode would refuse in the batch's values (RowError naming the row in the batch), checked where
        the batch's rows are known to come from (dataset.Chunk.located); by default the format holds any value."""

    @abstractmethod
    def open_sink(self, file: BinaryIO, schema: pa.Schema, options: WriteOptions) -> ShardSink:
        """A sink writing one shard into `file` (which hashes and counts what it is given)."""


class BatchIndex(ABC):
    """What finds the batches of an output batchtool wrote, for `batchtool.load` and `check DST`."""

    min_batch_bytes: ClassVar[float] = 1.0
    """Bytes of a file one batch takes at least (most_batches)."""

    def most_batches(self, size: int, codec: str | None) -> int:
        """The most batches a file of `size` bytes written with `codec` can hold: a manifest listing more is refused
        before its count sizes anything."""
        return int(size / self.min_batch_bytes)

    @abstractmethod
    def open_batches(self, dst: str, dataset: Dataset) -> tuple[np.ndarray, StoredBatches]:
        """Each file's batch count and where its batches are, for `batchtool.load` of the output DST (from the
        manifest, dataset.manifest, where it lists them; else from the files)."""

    @abstractmethod
    def inspect_shard(self, path: str, schema: pa.Schema, output: dict,
                      batch_column: str | None) -> tuple[int, int | None, str | None]:
        """What `check DST` verifies of one file against the manifest (`schema`, its `output` section): (rows,
        batches or None when the file marks none, how its schema differs or None), reading only what that takes;
        `batch_column` names the column whose runs mark the batches where they must be decoded to be counted
        (None: do not count them)."""


class Format(Reader, Writer, BatchIndex):
    """A format batchtool reads, writes (--to) and reads back batch by batch: the three parts in one class."""

    writes = True
