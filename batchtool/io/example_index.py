"""The example index every batch output carries beside its data files: the key of each example of each batch, in
batch order, with the permutation that sorts them by key, so that `batchtool where`/`step` find a key's batches or a batch's keys in O(log n)
from a memory map, and `check --receipts` can name the examples of a batch. A function of the data files' key
column, or without one of the input rows the batches carried to the writer (batchtool.io.example_ids), which no data
file holds."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import fs, rng
from batchtool.core.errors import BatchtoolError, InputError, OptionError
from batchtool.io.dataset import Dataset, ReadReport, Shard
from batchtool.io.formats.base import batch_of
from batchtool.io.formats.registry import FORMATS
from batchtool.io.ipc_single import NO_VALIDITY, Buffer, write_single_batch
from batchtool.io.key_sort import KeySort, search
from batchtool.io.manifest import dataset_file, manifest_path, schema_from_json
from batchtool.io.mixed import MixedDataset
from batchtool.io.output import HashingFile
from batchtool.io.workspace import Workspace

INDEX_NAME = ".batchtool_index"
"""A leading dot, as the manifest's, and no data suffix: directory readers skip it and no `*.arrow` or `*.parquet` glob
(polars and DuckDB match dot files) picks it up, so the output's data files stay the dataset."""
KEY_COLUMN = "key"
"""The column whose values are the examples' keys (a list of them per row in pack output: one per document)."""
READ_BATCHES = 1024
"""Batches of the key column read at a time while the index is built, at most."""
MEMORY_SHARE = 2
"""Building the index (after every data file is written) may hold about half of --memory: the keys it sorts at
once (key_sort.KeySort), the batches it reads and the pieces it writes."""
WINDOW_SHARE = 8
"""The batches of the key column read at once hold about an eighth of the build's share of --memory in keys (at
least one batch): how many follows the key bytes per batch of the batches read before, from one."""
SPOOL_SHARE = 8
"""Each of the index's columns (at most four spools) is held in memory up to an eighth of the build's share of
--memory before it goes to a file: half the share in all, the key sort's runs the other half."""
PIECE_BYTES = 1 << 20
"""The index's columns are streamed into it from the workspace's files in pieces of this size."""
_FIELDS = ("key", "batch", "by_key")
"""Per example in output order: its key, its batch; and the examples in key order (then batch order)."""


class NotFoundError(BatchtoolError):
    """A key the index does not hold: an answer, not bad usage, so exit status 1 (as a failed check)."""

    exit_code = 1


INPUT_ROWS, STAGE_ROWS = "input", "stage input"
"""What the manifest's `output.index.rows` says an example's key is when no column gives it: its row in the input
(InputRows), or in a pipeline's last stage's input. An index without it (batchtool before input rows) keys such
an example by its number in the output."""


def key_column(schema: pa.Schema, asked: str | None = None) -> str | None:
    """The column the keys come from: `asked` (--key; an OptionError unless the output has it, holding strings or
    integers, or lists of them), else `key` where it does; None: an example's key is its row in the input
    (InputRows)."""
    if asked is not None:
        if asked not in schema.names:
            raise OptionError("key", f"the output has no such column (it has {', '.join(schema.names)})",
                              value=repr(asked))
        if not _keys_type(schema.field(asked).type):
            raise OptionError("key", f"the column is {schema.field(asked).type}: expected strings or integers (or a "
                              "list of them per row)", value=repr(asked))
        return asked
    return KEY_COLUMN if KEY_COLUMN in schema.names and _keys_type(schema.field(KEY_COLUMN).type) else None


def _keys_type(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)


def _keys_of(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The keys a key column holds, nulls (no example) left out: a list column's elements in order."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    column = column.drop_null()
    return column.cast(pa.large_string() if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                       else pa.int64())


def _count(column: pa.Array) -> int:
    """The examples of one batch's key column: its non-null keys."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = column.flatten()
    return len(column) - column.null_count


class _Spool:
    """A column's bytes as they are read, streamed back into the index: held in memory up to `limit` bytes (an
    output whose index fits writes no file), then appended to a file of the workspace."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit, self.nbytes = path, limit, 0
        self._held: list[bytes] = []
        self._file: BinaryIO | None = None

    def append(self, data: np.ndarray | pa.Buffer) -> None:
        view = memoryview(data).cast("B")
        if self._file is None and self.nbytes + view.nbytes > self.limit:
            self._file = open(self.path, "wb")
            self._file.writelines(self._held)
            self._held = []
        if self._file is None:
            self._held.append(bytes(view))  # a copy: no piece keeps a file's memory map open
        else:
            self._file.write(view)
        self.nbytes += view.nbytes

    def buffer(self) -> Buffer:
        """What was appended (the file closed), as an index body buffer."""
        if self._file is None:
            return Buffer(self.nbytes, functools.partial(iter, tuple(self._held)))
        self._file.close()
        return Buffer(self.nbytes, functools.partial(_file_pieces, self.path))


def _file_pieces(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(PIECE_BYTES):
            yield piece


def _file_arrays(path: str, dtype: type) -> Iterator[np.ndarray]:
    """A file of one 8-byte NumPy type, PIECE_BYTES (a multiple of 8) at a time."""
    for piece in _file_pieces(path):
        yield np.frombuffer(piece, dtype=dtype)


class InputRows:
    """Each example id's key as an input row (core.rng.example_ids: shard << SHARD_BITS | row): its row in the input,
    rows counted from 0 across the input's files in the order it reads them; in a mix `SOURCE:ROW`, ROW counted so
    in source SOURCE (its position among the sources, the value of the output's source column). `dataset` None: the
    ids are row numbers already (a pipeline's stage after the first numbers its input's rows itself). Files are
    counted (their format's count_rows: footers, or a TFRecord file's records) only below the last one an id
    names."""

    def __init__(self, dataset: Dataset | None) -> None:
        self.parts = [] if dataset is None else [(p.dataset, [s.index for s in p.dataset.shards])
                                                 for p in dataset.parts()]
        self.mixed = isinstance(dataset, MixedDataset)
        self._source = np.array([i for i, (_, shards) in enumerate(self.parts) for _ in shards], dtype=np.int64)
        self._firsts: list[int] = []
        """The first row of each shard counted so far, within its source."""

    @property
    def name(self) -> str:
        """What output.index.rows records."""
        return STAGE_ROWS if not self.parts else INPUT_ROWS

    def _first_rows(self, last: int) -> np.ndarray:
        """The first row of shards 0..last within their source, counting the files before them not counted yet."""
        while len(self._firsts) <= last:
            shard = len(self._firsts)
            source = int(self._source[shard])
            dataset, shards = self.parts[source]
            if shard == shards[0]:
                self._firsts.append(0)
                continue
            before = dataset.shards[shards.index(shard) - 1]
            self._firsts.append(self._firsts[-1] + dataset.spec.count_rows(dataset, before, ReadReport()))
        return np.asarray(self._firsts, dtype=np.int64)

    def keys(self, ids: np.ndarray) -> pa.Array:
        """The keys of these ids (int64 rows; large_string `SOURCE:ROW` in a mix)."""
        if not self.parts:
            return pa.array(ids.astype(np.int64))
        shards = (ids >> np.uint64(rng.SHARD_BITS)).astype(np.int64)
        rows = (ids & np.uint64((1 << rng.SHARD_BITS) - 1)).astype(np.int64)
        if len(shards) and not 0 <= shards.max() < len(self._source):
            raise BatchtoolError(f"an example id names input file {int(shards.max())} of {len(self._source)}")
        rows += self._first_rows(int(shards.max(initial=-1)))[shards] if len(shards) else 0
        if not self.mixed:
            return pa.array(rows)
        return pc.binary_join_element_wise(pa.array(self._source[shards]).cast(pa.large_string()),
                                           pa.array(rows).cast(pa.large_string()),
                                           pa.scalar(":", pa.large_string()))


@dataclass(frozen=True)
class Carried:
    """The example ids the output's batches carried (batchtool.io.example_ids), as the writer kept them: directories
    in output order, each holding CarriedWriter's two files, and what their ids are as keys."""

    directories: tuple[str, ...]
    rows: InputRows


IDS_FILE, COUNTS_FILE = "ids", "counts"
"""The ids (uint64) of every example, and the examples of every batch (int64; -1: a batch that carried none)."""


class CarriedWriter:
    """Keeps the ids batches carry, in their order, in `directory` (made; a retried task's replaced); a file the OS
    refuses fails in `errors` (the workspace's, where the driver writes them)."""

    def __init__(self, directory: str,
                 errors: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        self._errors = errors
        os.makedirs(directory, exist_ok=True)
        self._ids = open(os.path.join(directory, IDS_FILE), "wb")
        self._counts = open(os.path.join(directory, COUNTS_FILE), "wb")

    def add(self, ids: np.ndarray | None) -> None:
        """The next batch's ids (None: it carried none)."""
        with self._errors():
            self._counts.write(np.array([-1 if ids is None else len(ids)], dtype=np.int64).tobytes())
            if ids is not None:
                self._ids.write(np.ascontiguousarray(ids, dtype=np.uint64).tobytes())

    def close(self) -> None:
        with self._errors():
            self._ids.close()
            self._counts.close()


def _key_spools(directory: str, strings: bool, limit: int) -> list[_Spool]:
    """Where the keys go in output order: their values, or (strings) their offsets and characters."""
    if not strings:
        return [_Spool(os.path.join(directory, "keys"), limit)]
    offsets = _Spool(os.path.join(directory, "offsets"), limit)
    offsets.append(np.zeros(1, dtype=np.int64))
    return [offsets, _Spool(os.path.join(directory, "characters"), limit)]


def _spool_keys(spools: list[_Spool], keys: pa.Array) -> None:
    """Append one chunk of keys (int64, or large_string; no nulls) to _key_spools' files."""
    if len(spools) == 1:
        spools[0].append(keys.to_numpy())
        return
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset:keys.offset + len(keys) + 1]
    spools[0].append(offsets[1:] - offsets[0] + spools[1].nbytes)
    spools[1].append(keys.buffers()[2][offsets[0]:offsets[-1]])


def build_index(directory: str, manifest: dict[str, Any], space: Workspace, memory: int,
                key: str | None = None, carried: Carried | None = None) -> dict[str, Any]:
    """Write the index of the output in `directory` (its data files written, `manifest` listing them, not yet
    written) as INDEX_NAME there, keyed by key_column(schema, `key`), else by the input rows of the ids its batches
    `carried`; returns the manifest's `output.index` entry (name, key column or what rows key it, examples, size,
    sha256). Reads only the key column (or the carried ids), a few batches at a time: the index's columns wait in
    memory up to their share (SPOOL_SHARE), beyond it in files of the workspace `space`, where the keys are also
    sorted in runs (key_sort), so the build holds about `memory` / MEMORY_SHARE however many examples the output
    has."""
    spec = FORMATS[manifest["output"]["format"]]
    schema = schema_from_json(manifest["schema"])
    shards = tuple(Shard(i, fs.join(directory, f["path"]), f["bytes"]) for i, f in enumerate(manifest["output"]["files"]))
    dataset = Dataset(directory, spec, shards, schema, options=spec.options_of(manifest["output"]), manifest=manifest)
    column = key_column(schema, key)
    if column is None and carried is None:
        raise BatchtoolError(f"{directory}: its batches carried no example ids to key its index with")
    with space.errors():
        spill = fs.make_unique_dir(space.directory, "index-")
    try:
        with space.errors():
            key_type, examples, buffers = _spooled(spill, dataset, column, carried,
                                                   max(1, memory // MEMORY_SHARE), space.errors)
        index_schema = pa.schema(zip(_FIELDS, (key_type, pa.int64(), pa.int64())))
        path = os.path.join(directory, INDEX_NAME)
        sink = HashingFile(path)
        try:  # a refused write here is the output's (write.write_manifest names DST)
            write_single_batch(sink.write, index_schema, examples, buffers)
        finally:
            sink.close()
        _read_back(path, index_schema, examples)
    finally:
        fs.remove_tree(spill)
    rows = {} if column is not None or carried is None else {"rows": carried.rows.name}
    return {"path": INDEX_NAME, "key": column, **rows, "examples": examples, "bytes": sink.bytes,
            "sha256": sink.sha256.hexdigest()}


def _read_back(path: str, schema: pa.Schema, examples: int) -> None:
    """The written index as pyarrow reads it: one batch of `examples` rows of `schema` whose buffers lie where its
    metadata says. ipc_single lays the file out by patching pyarrow's own one-row file; should a pyarrow release
    lay IPC files out another way, the write fails here, before DST is replaced, not in a later lookup."""
    try:
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            if not reader.schema.equals(schema) or sum(b.num_rows for b in batches) != examples or len(batches) > 1:
                raise ValueError(f"{len(batches)} batches, {sum(b.num_rows for b in batches):,} rows")
            for batch in batches:
                batch.validate()
    except (pa.ArrowException, ValueError) as exc:
        raise BatchtoolError(f"{path}: the example index written does not read back as written ({exc}); pyarrow "
                             f"{pa.__version__} lays out Arrow IPC files in a way this batchtool does not know") \
            from None


def _spooled(spill: str, dataset: Dataset, column: str | None, carried: Carried | None, budget: int,
             errors: Callable[[], AbstractContextManager[None]]) -> tuple[pa.DataType, int, list[Buffer]]:
    """The index's key type, examples and body buffers (the columns in output order spooled in `spill` as the
    output's key column, or the ids its batches carried, are read; the keys sorted there under `budget` bytes)."""
    held = budget // SPOOL_SHARE
    batch = _Spool(os.path.join(spill, "batch"), held)
    sort = KeySort(spill, budget - 4 * held, errors)
    key_type: pa.DataType = pa.int64()  # with no example at all
    spools: list[_Spool] = []
    batches = examples = 0

    def record(sizes: np.ndarray) -> None:  # the examples of the next batches
        nonlocal batches, examples
        batch.append(np.repeat(np.arange(batches, batches + len(sizes), dtype=np.int64), sizes))
        batches += len(sizes)
        examples += int(sizes.sum())

    def add(keys: pa.Array) -> None:  # the next keys, in output order
        nonlocal key_type, spools
        if not spools:
            key_type = keys.type
            spools = _key_spools(spill, pa.types.is_large_string(key_type), held)
        _spool_keys(spools, keys)
        sort.add(keys)

    if column is None:
        assert carried is not None, "build_index refuses an index with neither"
        ids = 0
        for directory in carried.directories:
            for sizes in _file_arrays(os.path.join(directory, COUNTS_FILE), np.int64):
                if (sizes < 0).any():
                    raise BatchtoolError(f"{dataset.src}: batch {batches + int(np.argmax(sizes < 0))} carried no "
                                         "example ids to key its index with")
                record(sizes)
            for piece in _file_arrays(os.path.join(directory, IDS_FILE), np.uint64):
                add(carried.rows.keys(piece))
                ids += len(piece)
        if ids != examples or batches != int(dataset.manifest["output"]["batches"]):
            raise BatchtoolError(f"{dataset.src}: {ids:,} example ids carried for {examples:,} examples in {batches:,} "
                                 f"batches of {dataset.manifest['output']['batches']:,}")
    else:
        _read_keys(dataset, column, budget, record, add)
    if not spools:  # no example: an empty column of int64 keys
        spools = _key_spools(spill, False, held)
    order = _Spool(os.path.join(spill, "by_key"), held)
    for positions in sort.positions():
        order.append(positions)
    return key_type, examples, [NO_VALIDITY, *(s.buffer() for s in spools), NO_VALIDITY, batch.buffer(),
                                NO_VALIDITY, order.buffer()]


def _read_keys(dataset: Dataset, column: str, budget: int, record: Callable[[np.ndarray], None],
               add: Callable[[pa.Array], None]) -> None:
    """The output's key column read a window of batches at a time, in order: each window's examples per batch to
    `record`, its keys (non-null, flattened, a copy: no key keeps a file's memory map open) to `add`."""
    counts, stored = dataset.spec.open_batches(dataset.src, dataset)
    wanted = max(1, budget // WINDOW_SHARE)
    cache: dict = {}
    try:
        for f, count in enumerate(int(c) for c in counts):
            start, window = 0, 1
            while start < count:
                local = np.arange(start, min(count, start + window), dtype=np.int64)
                columns = [batch_of(b).column(0) for b in stored.read(f, local, [column], dataset.projected_schema([column]),
                                                            cache)()]
                sizes = np.array([_count(c) for c in columns], dtype=np.int64)
                keys = _keys_of(pa.chunked_array(columns, type=dataset.schema.field(column).type))
                window = max(1, min(READ_BATCHES, wanted * len(local) // max(1, keys.nbytes)))
                if keys.num_chunks:
                    add(keys.combine_chunks())
                record(sizes)
                start += len(local)
                if stored.in_place():  # views of a memory map: its pages read so far leave this process with it
                    del columns, keys
                    stored.release(cache)
            stored.release(cache)
    finally:
        stored.release(cache)


@dataclass(frozen=True)
class ExampleIndex:
    """An output's index, memory-mapped: lookups read O(log n) keys and the keys they return."""

    path: str
    column: str | None
    """The column the keys are from; None: rows (`rows`) are."""
    rows: str | None
    """Without a column, what an example's key is (INPUT_ROWS, STAGE_ROWS); None: its number in the output (an index
    written before input rows)."""
    batches: int
    """Batches in the output: a batch number the index gives beyond them is a damaged index."""
    table: pa.RecordBatch

    def parse(self, text: str) -> str | int:
        """A key as the command line gives it, in the index's type."""
        if pa.types.is_integer(self.table.column(0).type):
            try:
                return int(text)
            except ValueError:
                what = f"integers (column {self.column!r})" if self.column is not None else \
                    "row numbers in the output" if self.rows is None else f"row numbers in the {self.rows}"
                raise InputError(f"{self.path}: the keys of this output are {what}; {text!r} is not one") from None
        return text

    def batches_of(self, key: str | int) -> np.ndarray:
        """The batch of each example with this key (ascending; empty: none has it)."""
        keys, by_key = self.table.column(0), self.table.column(2).to_numpy()
        lo, hi = _bound(keys, by_key, key, False), _bound(keys, by_key, key, True)
        examples = by_key[lo:hi]
        if len(examples) and not (0 <= examples.min() and examples.max() < len(keys)):
            raise InputError(f"{self.path}: names example {int(examples.max())} of {len(keys)}; the index is "
                             "damaged")
        return self._checked(self.table.column(1).to_numpy()[examples])

    def keys_of(self, batch: int) -> list[str | int]:
        """The keys of batch `batch`'s examples, in their order in the batch."""
        batches = self.table.column(1).to_numpy()
        lo, hi = np.searchsorted(batches, batch, "left"), np.searchsorted(batches, batch, "right")
        return self.table.column(0)[lo:hi].to_pylist()

    def first_key(self, batch: int) -> str | int | None:
        """The key of batch `batch`'s first example (None: it holds none), to name the batch."""
        keys = self.keys_of(batch)
        return keys[0] if keys else None

    def _checked(self, batches: np.ndarray) -> np.ndarray:
        if len(batches) and not (0 <= batches.min() and batches.max() < self.batches):
            raise InputError(f"{self.path}: names batch {int(batches.max())}, beyond the output's {self.batches}; "
                             "the index is not this output's")
        return batches


def _bound(values: pa.Array, order: np.ndarray, key: str | int, right: bool) -> int:
    """Where `key` goes in `values` taken in `order` (sorted: numpy's searchsorted, left or right), in O(log n)
    element reads."""

    def value(i: int) -> str | int:
        at = int(order[i])
        if not 0 <= at < len(values):
            raise InputError("the example index is damaged: it names an example it does not hold")
        return values[at].as_py()

    return search(value, len(order), key, right)


def open_index(dst: str, manifest: dict[str, Any]) -> ExampleIndex:
    """The index `manifest` (DST's, read and checked by manifest_reader) records: an InputError naming the
    file when the output has none, or when the file is not the one recorded (size, columns, lengths)."""
    entry = manifest["output"].get("index")
    where = manifest_path(dst)
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise InputError(f"{dst}: its manifest records no example index (written by batchtool before 0.x, or not "
                         "batch output); write it again to index it")
    path = dataset_file(dst, entry["path"], f"{where}: output.index")
    if not fs.is_file(path):
        raise InputError(f"{path}: listed in {where} but missing")
    if fs.file_size(path) != entry.get("bytes"):
        raise InputError(f"{path}: {fs.file_size(path):,} bytes, {where} says {entry.get('bytes')!r}; the index is "
                         "not this output's")
    try:
        reader = pa.ipc.open_file(fs.open_random_access(path))
        table = reader.get_batch(0) if reader.num_record_batches == 1 else None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: unreadable example index ({exc})") from None
    if (table is None or tuple(table.schema.names) != _FIELDS or table.num_rows != entry.get("examples")
            or table.column(1).type != pa.int64() or table.column(2).type != pa.int64()
            or table.column(0).null_count or table.column(1).null_count or table.column(2).null_count):
        raise InputError(f"{path}: not the example index {where} records")
    batches = int(manifest["output"]["batches"])
    rows = entry.get("rows")
    if rows not in (None, INPUT_ROWS, STAGE_ROWS):
        raise InputError(f"{where}: output.index.rows is {rows!r}: expected {INPUT_ROWS!r} or {STAGE_ROWS!r}")
    return ExampleIndex(path, entry.get("key"), rows, batches, table)


__all__ = ["INDEX_NAME", "INPUT_ROWS", "STAGE_ROWS", "Carried", "CarriedWriter", "ExampleIndex", "InputRows",
           "NotFoundError", "build_index", "key_column", "open_index"]
