"""`shuffle`: an exact seeded global permutation in bounded memory, or shuffle_batch's buffered shuffle."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import budget, exchange, fs, progress, rng, runner
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import UsageError
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, read_paths, write_job, write_manifest
from batchtool.exchange import SortedGroup
from batchtool.formats.base import EncodedBatch
from batchtool.ops.base import manifest_options
from batchtool.output import BatchShardWriter, OutputOptions, encode_batch, output_directory
from batchtool.runner import ordered_map
from batchtool.spill import Spill, parts_for

STAGE = "shuffle"
DEFAULT_MEMORY = 1 << 30
MAX_BATCH_ROWS = 65536
BATCH_BYTES = 1 << 19
"""Output row groups when --batch-size is not given: at most MAX_BATCH_ROWS rows and about BATCH_BYTES of
Arrow data. Fixed, not a share of --memory, since the row groups are part of the output, which the budget
never changes; small enough that the batches queued for writing stay well under any useful budget."""
PART_SHARE = 4
"""A spill part is at most --memory / PART_SHARE: reading one back holds it about three times over."""
BUFFER_COPIES, SLOT_BYTES = 5, 100
"""The buffered shuffle holds its buffer about BUFFER_COPIES times while gathering (the buffer, the pushed rows,
their concatenation and the new buffer) plus SLOT_BYTES of row numbers per slot."""
ONE_SHARD_MARGIN = 1
"""Sorted data (Arrow) this many times smaller than --shard-bytes is planned as one shard without measuring
its encoded size: encoding rarely makes data larger, and the shard task stops at once if the writer cuts
it earlier (see _write_shard), which then costs one shard's encoding."""
MEASURES_PER_WORKER = 2
"""A distributed shuffle measures its batches in this many tasks per worker CPU, so every worker encodes."""
TFRECORD_EXPANSION = {False: 4.0, True: 16.0}
"""Assumed Arrow bytes per TFRecord file byte (uncompressed, gzip) when the row count is unknown.

Deliberately high: too many spill parts only costs smaller reads, too few breaks the memory bound."""


@dataclass(frozen=True)
class ShuffleOptions:
    """What `shuffle` computes; the memory budget and temporary directory never change the output bytes."""

    memory: int = DEFAULT_MEMORY
    tmp_dir: str | None = None
    batch_size: int | None = None
    drop_remainder: bool = False
    buffer: int | None = None
    min_after_dequeue: int | None = None

    def __post_init__(self) -> None:
        if self.memory <= 0:
            raise UsageError(f"--memory {self.memory}: must be a positive size")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size}: must be at least 1")
        if self.drop_remainder and self.batch_size is None:
            raise UsageError("--drop-remainder needs --batch-size (the final partial batch is what it drops)")
        if self.buffer is not None and self.buffer < 1:
            raise UsageError(f"--buffer {self.buffer}: must be at least 1 row")
        if self.min_after_dequeue is not None and self.min_after_dequeue < 0:
            raise UsageError(f"--min-after-dequeue {self.min_after_dequeue}: must be >= 0")
        if self.buffer is not None and self.min_after_dequeue is not None and self.min_after_dequeue >= self.buffer:
            raise UsageError(f"--min-after-dequeue {self.min_after_dequeue} must be smaller than --buffer "
                             f"{self.buffer} (shuffle_batch's capacity)")

    @property
    def buffered(self) -> bool:
        return self.buffer is not None or self.min_after_dequeue is not None

    @property
    def capacity(self) -> int:
        """Rows the buffered shuffle draws from: --buffer, or the smallest capacity shuffle_batch allowed."""
        if self.buffer is not None:
            return self.buffer
        return (self.min_after_dequeue or 0) + (self.batch_size or 1)


# -- helpers shared by the resampling commands -------------------------------------------------------------


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


@dataclass(frozen=True)
class Yardstick:
    """The first chunk's Arrow bytes and rows: what the first pass sizes everything from, and all a worker
    that read the chunk needs to send back (see write_exchanged)."""

    bytes: int
    rows: int

    @staticmethod
    def of(chunk: Chunk | None) -> Yardstick | None:
        return None if chunk is None else Yardstick(arrow_bytes(chunk.data), chunk.num_rows)

    @property
    def per_row(self) -> float:
        return self.bytes / self.rows if self.rows else 1.0


def estimate_memory_bytes(dataset: Dataset, first: Chunk | None, rows: int | None = None) -> float:
    """Arrow bytes of the whole dataset, from the first chunk's bytes per row (see estimate_bytes)."""
    return estimate_bytes(dataset, Yardstick.of(first), rows)


def estimate_bytes(dataset: Dataset, first: Yardstick | None, rows: int | None = None) -> float:
    """Arrow bytes of the whole dataset, from the first chunk's bytes per row.

    File sizes underestimate memory (Parquet is compressed and encoded), so the first chunk is the
    yardstick. With no row count (TFRecord read without a manifest) it assumes a high expansion of
    the file bytes instead.
    """
    if first is None or first.rows == 0:
        return 0.0
    rows = rows if rows is not None else dataset.num_rows
    if rows is None and dataset.manifest:
        rows = dataset.manifest.get("output", {}).get("rows")
    if rows is None:
        gzip = any(s.path.lower().endswith((".gz", ".gzip")) for s in dataset.shards)
        return max(float(first.bytes), dataset.total_bytes * TFRECORD_EXPANSION[gzip])
    return first.bytes / first.rows * rows


def arrow_bytes(batch: pa.RecordBatch) -> int:
    """A batch's size as Arrow IPC, which is what a spill writes and reads back. Unlike nbytes it does not
    depend on how the buffers happen to be laid out (an all-valid bitmap, a slice), so a chunk that
    crossed to another process (--engine ray) measures the same."""
    return pa.ipc.get_record_batch_size(batch)


def default_batch_rows(bytes_per_row: float) -> int:
    return int(max(1, min(MAX_BATCH_ROWS, BATCH_BYTES / max(bytes_per_row, 1.0))))


def bytes_per_row(first: Chunk | Yardstick | None) -> float:
    """Arrow bytes per row of a (first) chunk: the yardstick for the whole stream."""
    first = first if first is None or isinstance(first, Yardstick) else Yardstick.of(first)
    return first.per_row if first is not None else 1.0


def output_batch_rows(first: Chunk | Yardstick | None, options: ShuffleOptions) -> int:
    """Rows per output batch: --batch-size, or a default sized from the first input chunk's bytes per row."""
    return options.batch_size or default_batch_rows(bytes_per_row(first))


def check_memory(options: ShuffleOptions, first: Chunk | Yardstick | None, rows: int | None) -> None:
    """Stop before shuffling if one --batch-size batch, or the --buffer, would not fit the budget."""
    per_row = bytes_per_row(first)
    if options.batch_size is not None:
        budget.check_rows("--batch-size", options.batch_size, rows, per_row, options.memory)
    if options.buffered:
        flag, value = ("--buffer", options.buffer) if options.buffer is not None else \
            ("--min-after-dequeue", options.min_after_dequeue)
        held = options.capacity if rows is None else min(options.capacity, rows)
        budget.check(f"{flag} {value}: a buffer of {held:,} rows", held * (BUFFER_COPIES * per_row + SLOT_BYTES),
                     options.memory, f"give a smaller {flag} or a larger --memory")


def spill_flush_bytes(memory: int, parts: int) -> int:
    """Spill write buffers together stay under a quarter of the budget, whatever the number of parts."""
    return max(16 << 10, min(4 << 20, memory // (4 * max(1, parts))))


def peek(chunks: Iterator[Chunk]) -> tuple[Chunk | None, Iterator[Chunk]]:
    """The first chunk, and the stream with it put back."""
    first = next(chunks, None)
    return first, (chunks if first is None else itertools.chain([first], chunks))


def emit(chunk: Chunk) -> tuple[list[pa.RecordBatch], int]:
    """write_job work for streams that are already output batches: one row group each."""
    return [chunk.data], chunk.num_rows


# -- keyed orders through spill files --------------------------------------------------------------------------


def keyed_spill(schema: pa.Schema, parts: Sequence[int], seed: int, stage: str, memory: int,
                tmp_dir: str | None) -> Spill:
    """A spill of several streams (the classes of balanced batches, or the one stream of a global shuffle),
    each read back sorted by its rows' keyed order: stream s is split into parts[s] ranges of that key,
    which changes how many files hold it, never its order (see batchtool.spill)."""
    return Spill(schema, parts, seed, stage, tmp_dir, flush_bytes=spill_flush_bytes(memory, sum(parts)))


def spill_streams(chunks: Iterable[Chunk], spill: Spill, streams_of: Callable[[Chunk], np.ndarray], desc: str,
                  total: int | None, quiet: bool) -> None:
    """Scatter every row of the chunks to its stream, then close the spill for reading."""
    with progress.bar(desc, total, quiet=quiet) as bar:
        for chunk in chunks:
            spill.add(chunk, streams_of(chunk))
            bar.update(chunk.num_rows)
    spill.finish()


# -- the buffered shuffle (shuffle_batch parity) --------------------------------------------------------------


class BufferedShuffle:
    """shuffle_batch's queue, made deterministic.

    Rows enter `capacity` slots in input order. Once the buffer is full, output position t takes
    slot floor(u_t * capacity), u_t keyed by t, and the next input row refills that slot. When the
    input ends, the remaining rows leave the same way from the shrinking buffer (the drawn slot is
    refilled from the last one). Decisions are made on row numbers; the rows themselves are gathered
    once per push, so memory holds the buffer plus one push of new rows.
    """

    def __init__(self, capacity: int, seed: int, schema: pa.Schema) -> None:
        self.capacity, self.seed, self.schema = capacity, seed, schema
        self._held = Chunk.concat([], schema)
        self._held_rows = np.zeros(0, dtype=np.int64)
        self._slots: list[int] = []
        self._next_row = 0
        self._out_pos = 0

    def _uniforms(self, count: int) -> list[float]:
        positions = np.arange(self._out_pos, self._out_pos + count, dtype=np.uint64)
        self._out_pos += count
        return rng.uniform(self.seed, STAGE + "/buffer", positions).tolist()

    def push(self, new: Chunk) -> Chunk:
        """Enqueue rows in order; returns the rows dequeued meanwhile (one per row past a full buffer)."""
        rows = list(range(self._next_row, self._next_row + new.num_rows))
        self._next_row += new.num_rows
        fill = min(self.capacity - len(self._slots), len(rows))
        self._slots.extend(rows[:fill])
        out: list[int] = []
        for u, row in zip(self._uniforms(len(rows) - fill), rows[fill:]):
            slot = int(u * self.capacity)
            out.append(self._slots[slot])
            self._slots[slot] = row
        return self._gather(new, out)

    def drain(self) -> Chunk:
        """The input has ended: dequeue everything left, one uniform draw over the remaining rows each."""
        slots = self._slots
        out: list[int] = []
        for u in self._uniforms(len(slots)):
            slot = int(u * len(slots))
            out.append(slots[slot])
            slots[slot] = slots[-1]
            slots.pop()
        return self._gather(Chunk.concat([], self.schema), out)

    def _gather(self, new: Chunk, out: list[int]) -> Chunk:
        pool = Chunk.concat([self._held, new], self.schema) if new.num_rows else self._held
        pool_rows = np.concatenate([self._held_rows, np.arange(self._next_row - new.num_rows, self._next_row)])
        order = np.argsort(pool_rows, kind="stable")
        sorted_rows = pool_rows[order]

        def positions(rows: list[int]) -> np.ndarray:
            return order[np.searchsorted(sorted_rows, np.asarray(rows, dtype=np.int64))]

        self._held, self._held_rows = pool.take(positions(self._slots)), np.asarray(self._slots, dtype=np.int64)
        return pool.take(positions(out))


def buffered_shuffle(chunks: Iterable[Chunk], capacity: int, seed: int, schema: pa.Schema) -> Iterator[Chunk]:
    """The buffered shuffle of a chunk stream; input is pushed in groups of at least `capacity` rows so
    that gathering (which copies the buffer) costs at most about one extra copy of the data."""
    buffer = BufferedShuffle(capacity, seed, schema)
    group: list[Chunk] = []
    rows = 0
    for chunk in chunks:
        group.append(chunk)
        rows += chunk.num_rows
        if rows >= capacity:
            out = buffer.push(Chunk.concat(group, schema))
            group, rows = [], 0
            if out.num_rows:
                yield out
    for out in (buffer.push(Chunk.concat(group, schema)), buffer.drain()):
        if out.num_rows:
            yield out


# -- entry point --------------------------------------------------------------------------------------------


@with_engine
def shuffle(src: str, dst: str, options: ShuffleOptions, output: OutputOptions, run: RunSettings = RunSettings(),
            *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """Shuffle SRC into DST: a global permutation through temporary spill files, or the buffered shuffle."""
    dataset = open_source(src, dst, output, tmp_dir=options.tmp_dir, format=format, skip_corrupt=skip_corrupt)
    return write_shuffled(dataset, options, dst, output, run, seed=seed)


def write_shuffled(dataset: Dataset, options: ShuffleOptions, dst: str, output: OutputOptions, run: RunSettings,
                   *, seed: int, write: Callable[..., JobResult] = write_job, who: str = "shuffle") -> JobResult:
    """The shuffle and the pass that writes (`write` is write_job, or a wrapper in a pipeline, whose stage
    name `who` then labels the progress bars). On a remote engine (--engine ray), the global shuffle of a
    command runs as map-reduce on the workers (write_exchanged)."""
    if not options.buffered and write is write_job and runner.active_engine() is not None and not fs.is_uri(dst):
        return write_exchanged(dataset, options, dst, output, run, seed=seed)
    report = ReadReport()
    with shuffled(dataset, options, seed, run, report, who=who) as out:
        return write(command="shuffle", options=manifest_options(options, output), seed=seed, dataset=dataset,
                     dst=dst, output=output, schema=dataset.schema, items=out.batches(), work=emit,
                     stats=out.stats, run=run, report=report, total_rows=out.rows)


@dataclass
class Shuffled:
    """A shuffle's output: `batches()` streams it (again, for the global shuffle; once, for the buffered
    one, which is computed as it streams) and `stats()` reports it once streamed."""

    batches: Callable[[], Iterator[Chunk]]
    rows_in: Callable[[], int]
    info: dict[str, Any]
    options: ShuffleOptions
    rows: int | None = None
    """Output rows, when known before streaming (global shuffle)."""

    def stats(self) -> dict[str, Any]:
        return shuffle_stats(self.info, self.rows_in(), self.options)


def shuffle_stats(info: dict[str, Any], rows_in: int, options: ShuffleOptions) -> dict[str, Any]:
    dropped = rows_in % info["batch_rows"] if options.drop_remainder else 0
    return {**info, "rows_in": rows_in, "examples_dropped": dropped}


@contextmanager
def shuffled(dataset: Dataset, options: ShuffleOptions, seed: int, run: RunSettings, report: ReadReport,
             columns: Sequence[str] | None = None, who: str = "shuffle") -> Iterator[Shuffled]:
    """Shuffle the dataset's rows (only `columns`, if given). The global shuffle spills every row here,
    in the calling thread, and removes its files when the block ends; the buffered one streams.
    `who` labels the progress bar (`run` gives its stage's name)."""
    schema = dataset.projected_schema(columns)
    first, chunks = peek(dataset.chunks(columns, run.threads, report))
    info = plan(dataset, options, Yardstick.of(first))
    batch_rows = info["batch_rows"]
    if options.buffered:
        info["capacity"] = options.capacity
        counted = _Counted(chunks)
        yield Shuffled(lambda: rebatch(buffered_shuffle(counted, options.capacity, seed, schema), batch_rows, schema,
                                       options.drop_remainder), lambda: counted.rows, info, options)
        return
    parts = info["parts"]
    with keyed_spill(schema, [parts], seed, STAGE, options.memory, options.tmp_dir) as spill:
        spill_streams(chunks, spill, lambda c: np.zeros(c.num_rows, dtype=np.int64), f"{who}: spill",
                      dataset.progress_rows, run.quiet)
        rows = int(spill.rows[0])
        yield Shuffled(lambda: rebatch(spill.read_group(0), batch_rows, schema, options.drop_remainder),
                       lambda: rows, info, options, rows)


def plan(dataset: Dataset, options: ShuffleOptions, first: Yardstick | None) -> dict[str, Any]:
    """From the first chunk, before any row moves: check the budget, size the output batches and (global
    shuffle) the spill's key ranges; the manifest's statistics of the plan."""
    estimate = estimate_bytes(dataset, first)
    check_memory(options, first, dataset.num_rows if dataset.num_rows is not None
                 else int(estimate / bytes_per_row(first)))
    info: dict[str, Any] = {"mode": "buffered" if options.buffered else "global",
                            "batch_rows": output_batch_rows(first, options), "estimated_bytes": int(estimate)}
    if not options.buffered:
        info["parts"] = parts_for(estimate, options.memory // PART_SHARE)
    return info


# -- the global shuffle as map-reduce on a remote engine's workers ----------------------------------------------


@dataclass(frozen=True)
class _Batches:
    """The output batches of a sorted stream (SortedGroup) as write_job would write them: batch k holds rows
    [k * batch_rows, (k + 1) * batch_rows) of the first `rows` (the remainder already dropped if asked)."""

    rows_in: SortedGroup
    schema: pa.Schema
    batch_rows: int
    rows: int
    output: OutputOptions
    stored: pa.Schema

    @property
    def count(self) -> int:
        return -(-self.rows // self.batch_rows)

    def encoded(self, start: int, end: int) -> Iterator[EncodedBatch]:
        """Batches [start, end), encoded; cut from the same chunks at the same offsets as a local run, so
        laid out the same."""
        first = start * self.batch_rows
        reader = RowReader(self.rows_in.chunks(first), self.schema)
        reader.take(first - self.rows_in.first_row(first))
        for k in range(start, end):
            batch = reader.take(min(self.batch_rows, self.rows - k * self.batch_rows))
            yield encode_batch(batch.data, self.output)


class _CountingFile:
    """A file that only counts what is written to it: a shard's size, batch by batch, without keeping it."""

    def __init__(self) -> None:
        self.bytes = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self.bytes += memoryview(data).nbytes
        return memoryview(data).nbytes

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    @property
    def writable(self) -> bool:
        return True


def _measure(job: tuple[_Batches, int, int]) -> tuple[int, list[int]]:
    """A map task over batches [start, end): the bytes a shard holds once opened, and the bytes each batch
    adds to it (one sink for the whole run, whose file only counts)."""
    batches, start, end = job
    file = _CountingFile()
    sink = batches.output.spec.open_sink(file, batches.stored, batches.output)
    opened, added = file.bytes, []
    for encoded in batches.encoded(start, end):
        before = file.bytes
        sink.write(encoded)
        added.append(file.bytes - before)
    sink.abandon()
    return opened, added


def _shard_ends(sizes: Iterable[tuple[int, Iterable[int]]], batches: _Batches) -> list[int]:
    """Where BatchShardWriter would close each shard, from the measured sizes: after the batch that reaches
    --shard-rows, --shard-bytes or the format's batches per shard (OutputOptions.shard_full), and at the end."""
    o = batches.output
    ends: list[int] = []
    rows = size = count = k = 0
    for opened, added in sizes:
        for batch_bytes in added:
            if count == 0:
                rows, size = 0, opened
            rows += min(batches.batch_rows, batches.rows - k * batches.batch_rows)
            size += batch_bytes
            count += 1
            k += 1
            if o.shard_full(rows, size, count):
                ends.append(k)
                count = 0
    if not ends or ends[-1] != batches.count:
        ends.append(batches.count)
    return ends


@dataclass(frozen=True)
class _Shard:
    """One shard to write on a worker: batches [start, end) as part-<index>."""

    batches: _Batches
    index: int
    start: int
    end: int
    last: bool
    directory: str
    scratch: str
    name: str


def _write_shard(shard: _Shard) -> dict | None:
    """Write one shard with the local writer; its manifest entry, or None if the writer did not close it
    exactly where planned (a format whose shard size is not the sum of its batches' sizes): then the
    driver writes every shard in one task instead."""
    with suppress(FileExistsError):  # (a retried task) not makedirs: see exchange._map
        os.mkdir(shard.scratch)
    writer = BatchShardWriter(shard.scratch, shard.batches.stored, shard.batches.output, name=shard.name)
    for written, encoded in enumerate(shard.batches.encoded(shard.start, shard.end), 1):
        writer.write(encoded)
        if "sha256" in writer.files[0] and written < shard.end - shard.start:  # cut before the planned end
            return None
    closed_by_writer = "sha256" in writer.files[0]
    files = writer.close()
    if not (closed_by_writer or shard.last):
        return None
    entry = dict(files[0], path=f"part-{shard.index:05d}{shard.batches.output.suffix}")
    os.replace(os.path.join(shard.scratch, files[0]["path"]), os.path.join(shard.directory, entry["path"]))
    return entry


def _write_all(job: tuple[_Batches, str, str, str]) -> list[dict]:
    """Every shard in one task, in order: the writer run exactly as write_job runs it (in the scratch
    directory, then moved, so nothing is written in DST's temporary directory once the exchange is gone)."""
    batches, directory, scratch, name = job
    os.mkdir(scratch)
    writer = BatchShardWriter(scratch, batches.stored, batches.output, name=name)
    for encoded in batches.encoded(0, batches.count):
        writer.write(encoded)
    files = writer.close()
    for entry in files:
        os.replace(os.path.join(scratch, entry["path"]), os.path.join(directory, entry["path"]))
    return files


def write_sorted(batches: _Batches, directory: str, scratch: str, name: str, segments: int,
                 threads: int) -> list[dict]:
    """Write a sorted stream's batches as the local writer would, on the engine's workers: measure every
    batch's encoded size (`segments` tasks; not when no --shard-bytes applies, or the data is far smaller),
    place the shard boundaries as the writer would, write the shards in parallel. Falls back to one task
    writing them all when a shard task finds the writer would have cut elsewhere."""
    if batches.count:
        output = batches.output
        if output.shard_bytes is None or batches.rows_in.nbytes() * ONE_SHARD_MARGIN <= output.shard_bytes:
            sizes: Iterable[tuple[int, Iterable[int]]] = [(0, itertools.repeat(0, batches.count))]
        else:
            step = -(-batches.count // max(1, segments))
            sizes = ordered_map(_measure, [(batches, k, min(k + step, batches.count))
                                           for k in range(0, batches.count, step)], threads)
        ends = _shard_ends(sizes, batches)
        shards = [_Shard(batches, i, start, end, i == len(ends) - 1, directory, os.path.join(scratch, f"w{i:06d}"),
                         name) for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
        files = list(ordered_map(_write_shard, shards, threads))
        if all(entry is not None for entry in files):
            return files
        for entry in files:
            if entry is not None:
                os.remove(os.path.join(directory, entry["path"]))
    return next(iter(ordered_map(_write_all, [(batches, directory, os.path.join(scratch, "all"), name)], threads)))


def write_exchanged(dataset: Dataset, options: ShuffleOptions, dst: str, output: OutputOptions, run: RunSettings,
                    *, seed: int) -> JobResult:
    """The global shuffle with no row passing through the driver: map tasks on the workers read the input and
    scatter it to key ranges under DST's temporary directory (batchtool.exchange), reduce tasks sort each
    range, and the shards are measured and written there in parallel (write_sorted); the driver plans,
    counts and writes the manifest. The same bytes and statistics as the local spill: the same keys, key
    ranges and order, batches cut from the same chunks, the same writer and shard boundaries."""
    started = time.perf_counter()
    report = ReadReport()
    first, units = exchange.probe(exchange.read_units(dataset), Yardstick.of, run.threads)
    info = plan(dataset, options, first)
    casts = output.casts(dataset.schema)
    stored = output.stored_schema(dataset.schema)
    workers = max(1, getattr(runner.active_engine(), "cpus", run.threads))
    parts = info["parts"]  # more ranges would sort the same, but cut batches across more chunks: Arrow IPC
    # output records how a batch's buffers are laid out, so its bytes would change
    with output_directory(dst, output.overwrite, read_paths(dataset)) as tmp:
        with exchange.workspace(tmp, dst) as directory:
            job = exchange.MapJob(directory, dataset.schema, (parts,), seed, STAGE,
                                  spill_flush_bytes(options.memory, parts), dst)
            part_rows = exchange.scatter(units, job, run.threads, report, "shuffle: spill", dataset.progress_rows,
                                         run.quiet)[0]
            rows = int(part_rows.sum())
            with progress.bar("shuffle: write", rows, quiet=run.quiet) as bar:
                group = exchange.sort_group(directory, seed, STAGE, 0, part_rows, run.threads)
                kept = rows - (rows % info["batch_rows"] if options.drop_remainder else 0)
                batches = _Batches(group, dataset.schema, info["batch_rows"], kept, output, stored)
                files = write_sorted(batches, tmp, directory, dst, MEASURES_PER_WORKER * workers, run.threads)
                bar.update(rows)
        manifest = write_manifest(tmp, command="shuffle", options=manifest_options(options, output), seed=seed,
                                  dataset=dataset, dst=dst, output=output, schema=stored, casts=casts, files=files,
                                  rows_in=kept, rows_out=kept, stats=lambda: shuffle_stats(info, rows, options),
                                  run=run, report=report, started=started)
    return JobResult(manifest, kept, kept)


class _Counted:
    """Counts the rows of a chunk stream as it is consumed (the buffered shuffle has no first pass)."""

    def __init__(self, chunks: Iterable[Chunk]) -> None:
        self._chunks = iter(chunks)
        self.rows = 0

    def __iter__(self) -> Iterator[Chunk]:
        for chunk in self._chunks:
            self.rows += chunk.num_rows
            yield chunk


__all__ = ["RowReader", "ShuffleOptions", "Shuffled", "buffered_shuffle", "rebatch", "shuffle",
           "shuffled", "keyed_spill", "spill_streams", "write_shuffled"]
