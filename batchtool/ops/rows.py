"""Rows of chunk streams, shared by the ops that regroup them: cutting streams into exact sizes, the first
chunk as the yardstick of a stream's bytes, and the data's size estimated from it."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from batchtool.io.dataset import Chunk
from batchtool.io.example_ids import carry
import numpy as np
import pyarrow.compute as pc

from batchtool.ops.regroup import Input, SortedBatches, SortedStream

FILE_EXPANSION = {False: 4.0, True: 16.0}
"""Assumed Arrow bytes per file byte (uncompressed, gzip) when the row count is unknown (files that do not count
their rows, read without a manifest).

Deliberately high: too many spill parts only costs smaller reads, too few breaks the memory bound."""


def slice_chunk(chunk: Chunk, start: int, length: int) -> Chunk:
    return Chunk(chunk.data.slice(start, length), chunk.ids[start:start + length])


class RowReader:
    """Hands out the rows of a stream of chunks in requested amounts, across chunk boundaries."""

    def __init__(self, chunks: Iterable[Chunk], schema: pa.Schema) -> None:
        self._chunks = iter(chunks)
        self._schema = schema
        self._current: Chunk | None = None
        self._offset = 0

    def take(self, n: int) -> Chunk:
        """The next n rows (fewer only when the stream ends)."""
        pieces: list[Chunk] = []
        need = n
        while need > 0:
            if self._current is None or self._offset == self._current.num_rows:
                self._current, self._offset = next(self._chunks, None), 0
                if self._current is None:
                    break
                continue
            count = min(need, self._current.num_rows - self._offset)
            pieces.append(slice_chunk(self._current, self._offset, count))
            self._offset += count
            need -= count
        return pieces[0] if len(pieces) == 1 else Chunk.concat(pieces, self._schema)


def rebatch(chunks: Iterable[Chunk], size: int, schema: pa.Schema, drop_remainder: bool = False) -> Iterator[Chunk]:
    """Cut a stream of chunks into batches of exactly `size` rows; the last may be smaller unless dropped."""
    reader = RowReader(chunks, schema)
    while True:
        batch = reader.take(size)
        if batch.num_rows == 0 or (drop_remainder and batch.num_rows < size):
            return
        yield batch


def take_sizes(chunks: Iterator[Chunk], sizes: Sequence[int], schema: pa.Schema) -> Iterator[Chunk]:
    """Cut a stream of chunks into consecutive pieces of exactly these sizes (copying only across chunk edges)."""
    pending: list[Chunk] = []
    held = 0
    for size in sizes:
        while held < size:
            chunk = next(chunks)
            pending.append(chunk)
            held += chunk.num_rows
        last = pending[-1]
        need = size - (held - last.num_rows)
        head = [*pending[:-1], slice_chunk(last, 0, need)]
        yield head[0] if len(head) == 1 else Chunk.concat(head, schema)
        rest = slice_chunk(last, need, last.num_rows - need)
        pending, held = ([rest], rest.num_rows) if rest.num_rows else ([], 0)


def peek(chunks: Iterator[Chunk]) -> tuple[Chunk | None, Iterator[Chunk]]:
    """The first chunk, and the stream with it put back."""
    first = next(chunks, None)
    return first, (chunks if first is None else itertools.chain([first], chunks))


def emit(chunk: Chunk) -> tuple[list[pa.RecordBatch], int]:
    """The writer's work for streams that are already output batches: one row group each."""
    return [chunk.data], chunk.num_rows


def emit_batch(chunk: Chunk) -> tuple[list[pa.RecordBatch], int]:
    """emit for batch output: each batch carries its rows' example ids (batchtool.io.example_ids)."""
    return [carry(chunk.data, chunk.ids)], chunk.num_rows


@dataclass(frozen=True)
class Yardstick:
    """The first chunk's Arrow bytes and rows: what a first pass sizes everything from, and all a worker
    that read the chunk needs to send back (see batchtool.exec.exchange.regrouping, its probe)."""

    bytes: int
    rows: int

    @staticmethod
    def of(chunk: Chunk | None) -> Yardstick | None:
        return None if chunk is None else Yardstick(arrow_bytes(chunk.data), chunk.num_rows)

    @property
    def per_row(self) -> float:
        return self.bytes / self.rows if self.rows else 1.0


def estimate_bytes(input: Input, first: Yardstick | None, rows: int | None = None) -> float:
    """Arrow bytes of the whole input, from the first chunk's bytes per row.

    File sizes underestimate memory (Parquet is compressed and encoded), so the first chunk is the
    yardstick. With no row count (files that do not count their rows, read without a manifest) it assumes a
    high expansion of the file bytes instead.
    """
    if first is None or first.rows == 0:
        return 0.0
    rows = rows if rows is not None else input.estimate_rows
    if rows is None:
        return max(float(first.bytes), input.file_bytes * FILE_EXPANSION[input.gzip])
    return first.bytes / first.rows * rows


def arrow_bytes(batch: pa.RecordBatch) -> int:
    """A batch's size as Arrow IPC, which is what a spill writes and reads back. Unlike nbytes it does not
    depend on how the buffers happen to be laid out (an all-valid bitmap, a slice), so a chunk that
    crossed to another process (--engine ray) measures the same."""
    return pa.ipc.get_record_batch_size(batch)


def bytes_per_row(first: Chunk | Yardstick | None) -> float:
    """Arrow bytes per row of a (first) chunk: the yardstick for the whole stream."""
    first = first if first is None or isinstance(first, Yardstick) else Yardstick.of(first)
    return first.per_row if first is not None else 1.0


@dataclass(frozen=True)
class FixedBatches(SortedBatches):
    """A sorted stream's rows cut into batches of `batch_size` (ops.regroup.SortedBatches): batch k holds rows
    [k * batch_size, (k + 1) * batch_size) of the first `kept` (a dropped remainder already left out), cut from
    the same chunks at the same offsets as `rebatch` over the stream, so laid out the same."""

    stream: SortedStream
    schema: pa.Schema
    batch_size: int
    kept: int
    """The rows cut into batches."""
    carried: bool = False
    """Each batch carries its rows' example ids (batchtool.io.example_ids): batch output."""

    @functools.cached_property
    def firsts(self) -> np.ndarray:  # type: ignore[override]
        return np.minimum(np.arange(-(-self.kept // self.batch_size) + 1, dtype=np.int64) * self.batch_size, self.kept)

    def reader(self, start: int, end: int) -> _FixedReader:
        return _FixedReader(self.stream, self.schema, self.batch_size, self.kept, start, end, self.carried)

    def nbytes(self) -> int:
        return self.stream.nbytes()


@dataclass(frozen=True)
class _FixedReader:
    """Batches [start, end) of a FixedBatches, as a task: its stream and arithmetic, not a number per batch (a task
    sent to a worker stays a few hundred bytes however many batches the output has)."""

    stream: SortedStream
    schema: pa.Schema
    batch_size: int
    kept: int
    start: int
    end: int
    carried: bool = False

    def __call__(self) -> Iterator[pa.RecordBatch]:
        first = self.start * self.batch_size
        reader = RowReader(self.stream.chunks(first), self.schema)
        reader.take(first - self.stream.first_row(first))
        for k in range(self.start, self.end):
            rows = reader.take(min(self.batch_size, self.kept - k * self.batch_size))
            yield carry(rows.data, rows.ids) if self.carried else rows.data


def sorted_rows(streams: Iterable[SortedStream], start: int = 0) -> Iterator[Chunk]:
    """The rows of sorted streams read one after another, from row `start` on, in the chunks a local spill
    reads back (the first one sliced): any run of rows cut from them is laid out as a local run cuts it."""
    for stream in streams:
        rows = sum(stream.part_rows)
        if start >= rows:
            start -= rows
            continue
        skip = start - stream.first_row(start)
        for chunk in stream.chunks(start):
            yield slice_chunk(chunk, skip, chunk.num_rows - skip) if skip else chunk
            skip = 0
        start = 0


def cycled_rows(stream: SortedStream, start: int, again: bool) -> Iterator[Chunk]:
    """A sorted stream from row `start` (modulo its rows) on, then, if `again`, from its first row again
    without end (balanced batches that oversample a class)."""
    rows = sum(stream.part_rows)
    yield from sorted_rows([stream], start % rows if rows else 0)
    while again and rows:
        yield from stream.chunks()


def keep_mask(chunk: Chunk, column: str) -> np.ndarray:
    """The rows to keep: where the boolean column is true, null counting as false (`tf.contrib.training.bucket`'s
    keep_input; bucket's --keep is this filter)."""
    return pc.fill_null(chunk.data.column(column), False).to_numpy(zero_copy_only=False)


__all__ = ["FixedBatches", "RowReader", "take_sizes", "cycled_rows", "sorted_rows", "Yardstick", "arrow_bytes", "bytes_per_row", "emit", "emit_batch", "estimate_bytes",
           "peek", "rebatch", "slice_chunk"]
