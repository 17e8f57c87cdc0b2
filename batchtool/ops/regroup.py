"""What an op that regroups its whole input declares (batchtool.exec.exchange runs it the same way on every engine): its
exchange (rows scattered to key ranges, each range sorted, the sorted rows cut into batches) or its stream of items,
what it is told of its input (Input) and what the driver lends it to run them, its rows included (Runtime)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from batchtool.io.dataset import Chunk, ReadReport
from batchtool.core.runner import Executor
from batchtool.core.tally import Tally
from batchtool.io.workspace import Workspace


class Bar(Protocol):
    def update(self, n: int) -> Any: ...


class Kernel(Protocol):
    """An op as Runtime.apply runs it: its per-chunk kernel, with a plan that may change chunk by chunk
    (ops.base.Operation is one; declared here, below the operation interface, which imports this module)."""

    def per_chunk(self, plan: Any) -> Callable[[Chunk], Any] | None: ...

    def kernel(self, plan: Any, chunk: Chunk) -> tuple[Any, Tally]: ...


class Repeat(NamedTuple):
    """A row whose key an earlier row holds: its example id, the earliest such row's, and its values (by column)."""

    id: int
    first: int
    row: dict[str, Any]


class DistinctKeys(Protocol):
    """A distinct-keys check the runtime lends (batchtool.exec.distinct.KeyPairs): each chunk's key hashes written
    where the chunk is read; the repeated keys found by the runtime (Runtime.repeats) once every chunk is in."""

    def write(self, index: int, hashes: np.ndarray, ids: np.ndarray) -> None:
        """Chunk number `index`'s (key hash, example id) pairs, on any worker (the check pickles)."""
        ...


T = TypeVar("T")


@dataclass(frozen=True)
class Input:
    """What an op that regroups its input knows of it before a row is read; the rows come from the driver (the probe,
    Runtime.rows, Runtime.map_rows): `locate` names a row in errors (it pickles), `num_rows` where the files count
    them, `estimate_rows` also where a manifest does (Dataset.progress_rows: for estimates, never a buffer's size),
    `file_bytes` and `gzip` the files' (ops.rows.estimate_bytes without a count)."""

    schema: pa.Schema
    locate: Callable[[int], str]
    num_rows: int | None = None
    estimate_rows: int | None = None
    file_bytes: int = 0
    gzip: bool = False


class Runtime(Protocol):
    """What the driver lends an op that regroups its whole input: its rows, the executor of its tasks (threads or a
    cluster's workers), their workspace and progress bars, so that ops neither read, choose nor import them."""

    executor: Executor
    """Runs the op's tasks (`fn` must pickle: it may run remotely), results in input order."""
    space: Workspace
    """The run's workspace (batchtool.io.workspace), which the executor's workers write and read: where a task leaves
    what later tasks read, instead of sending it to the driver."""

    def bar(self, desc: str, total: int | None) -> AbstractContextManager[Bar]:
        """A progress bar for a pass (as the run shows progress: --progress); `desc` names the pass ("spill"),
        the runtime says whose it is (`shuffle: spill`, `stage 1 (shuffle): spill`)."""
        ...

    def rows(self, columns: Sequence[str] | None, report: ReadReport) -> Iterator[Chunk]:
        """The input's chunks of these columns (None: all) in input order, read on the executor (skips to `report`)."""
        ...

    def map_rows(self, fn: Callable[[int, Chunk], T], columns: Sequence[str] | None,
                 report: ReadReport) -> Iterator[T]:
        """fn(number, chunk) of every chunk of these columns (numbered in input order) where it is read; in order."""
        ...

    def apply(self, op: Kernel, plan: Any, report: ReadReport) -> tuple[Iterator[tuple[Chunk, int]], Tally]:
        """`op`'s kernel over every chunk of the input on the engine, for an op that regroups its own kernel's
        output: the output chunks in input order, each with the input rows it completes, and the kernels'
        statistics, merged into that Tally in input order as the chunks are read."""
        ...

    def distinct(self, budget: int) -> DistinctKeys:
        """A new distinct-keys check in the workspace, whose search for repeats holds at most `budget` bytes."""
        ...

    def repeats(self, keys: DistinctKeys, columns: Sequence[str], limit: int) -> tuple[int, list[Repeat]]:
        """How many rows repeat an earlier row's `columns` (hashed into `keys`), the first `limit` by id, confirmed."""
        ...


@dataclass
class Regrouped:
    """The output of an op that regroups its whole input (Kind.REORDERS, Kind.BATCHES), valid while its
    `regroup` context is open: the items, the work that turns one item into output batches (on the
    engine's workers) with the input rows it completes, and the statistics once every item is written."""

    items: Iterable[Any]
    work: Callable[[Any], tuple[list[pa.RecordBatch], int]]
    stats: Callable[[], dict[str, Any]]
    total_rows: int | None = None
    """The input rows the items complete (the write's progress total); None: the input's rows."""
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records."""
    stacked_rows: int | None = None
    """Every batch has this many rows, and `work` may give several consecutive ones as one record batch (a stack,
    cut back where the output format stores batches apart: OutputOptions.stacked_rows); None: one each."""


@dataclass(frozen=True)
class Stream:
    """A regrouping whose order depends on every row before it (the buffered shuffle, plain batches of a selection,
    segment's lanes), made as the input streams through the driver: `open(runtime, report)` gives its items,
    valid while the block is open; the writer's tasks turn each into output batches."""

    open: Callable[[Runtime, ReadReport], AbstractContextManager[Regrouped]]


class Probe(Protocol):
    """probe(measure): measure of the input's first chunk it is not None for (None: none), computed where the chunk
    is read; `in_order`: on the driver, chunk after chunk (a measure that carries state from chunk to chunk)."""

    def __call__(self, measure: Callable[[Chunk], T | None], in_order: bool = False) -> T | None: ...


@dataclass(frozen=True)
class Scatter:
    """The map side of an Exchange: every row of `schema` to (group, part), part = the range of its keyed order
    key (`stage`, `seed`) among the group's `parts` (batchtool.io.spill). Each part is then sorted on a worker: by
    the key (unless not `keyed`: input order), then stably by `order` if given."""

    schema: pa.Schema
    parts: tuple[int, ...]
    """Key ranges of each group."""
    seed: int
    stage: str
    flush_bytes: int
    prepare: Callable[[Chunk], tuple[Chunk, np.ndarray, Any]] | None = None
    """Run on the map worker per input chunk: the rows to scatter, each one's group, and statistics that go
    back to the driver (Scattered.stats, in input order); None: every row as read, all in group 0."""
    keyed: bool = True
    order: Callable[[pa.RecordBatch], np.ndarray] | None = None
    """The positions that put a sorted part in its final order (a stable sort: bucket's --order sorted by length,
    pack's rows by output position); None: the key's order."""


class SortedStream(Protocol):
    """One group's rows after the reduce, in order (batchtool.exec.exchange.SortedGroup: in files every worker reads, or
    held in memory on the local engine): one chunk per part, laid out as a local Spill.read_group yields them."""

    part_rows: tuple[int, ...]

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """The chunks from the one holding row `start` on (which begins at first_row(start))."""
        ...

    def first_row(self, start: int) -> int: ...

    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class Scattered:
    """What the map and reduce tasks made: every group's sorted rows, rows per group, and the statistics of
    Scatter.prepare, one per input chunk in input order."""

    schema: pa.Schema
    groups: list[SortedStream]
    rows: np.ndarray
    stats: list[Any]


class SortedBatches(ABC):
    """An exchange's output batches, cut from sorted streams where they are read: the driver plans shards from
    their sizes, and workers read any run of them through `reader`. Each cut gives where its batches begin (`firsts`)
    and how to read them; their counts are answered here, once for every cut."""

    firsts: np.ndarray
    """Each batch's first output row, and the total rows last (count + 1 numbers)."""

    @property
    def count(self) -> int:
        return len(self.firsts) - 1

    @property
    def rows(self) -> int:
        return int(self.firsts[-1])

    def batch_rows(self, k: int) -> int:
        return int(self.firsts[k + 1] - self.firsts[k])

    def first_row(self, k: int) -> int:
        """The output row number of batch k's first row."""
        return int(self.firsts[k])

    @abstractmethod
    def reader(self, start: int, end: int) -> Callable[[], Iterator[pa.RecordBatch]]:
        """Batches [start, end) as a task a worker runs (small to send: it carries only what those batches
        need), laid out exactly as `regroup` gives them; a batch op's each carrying its examples' ids as one more
        column (batchtool.io.example_ids), which the writer takes off."""

    @abstractmethod
    def nbytes(self) -> int:
        """The sorted data's bytes, before any output encoding."""


def firsts_of(rows: np.ndarray | Sequence[int]) -> np.ndarray:
    """SortedBatches.firsts of batches of these rows."""
    return np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)


@dataclass(frozen=True)
class Cut:
    """An exchange's output: its batches, and the manifest's statistics once they are written."""

    batches: SortedBatches
    stats: Callable[[], dict[str, Any]]
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records (None: every list)."""
    padding: dict[str, Any] | None = None
    """How batchtool.load pads the batches, stored at their real lengths (the manifest's output.padding); None:
    they are stored as load hands them out."""


@dataclass(frozen=True)
class Exchange:
    """A regrouping as one physical plan (batchtool.exec.exchange), run the same way on every engine: the rows scattered
    (`scatter`) to key ranges in the run's workspace (or memory, batchtool.exec.held) by map tasks, each range sorted by a task, then
    `cut(scattered, runtime)` plans the output batches (on the driver, from counts; any pass over the sorted rows
    as tasks on the runtime), which the writer's tasks read, build and write."""

    scatter: Scatter
    cut: Callable[[Scattered, Runtime], Cut]
    rows: Callable[[Runtime, ReadReport], Iterator[tuple[Chunk, np.ndarray, Any]]] | None = None
    """For an op whose groups depend on the rows before (pack's slots, online stratify's running estimate): its rows
    to scatter, their groups and statistics, made in input order on the driver (its per-chunk work may still run
    on the runtime's workers), scattered there as one map task; None: map tasks over the input run `prepare`."""


