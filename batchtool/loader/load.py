"""`batchtool.load`: the batches of a batch-shard output for a training loop: epochs, ranks, exact resume, workers."""

from __future__ import annotations

import mmap
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import fs
from batchtool.loader.arrays import StackViews, column_to_numpy, hand_out, to_numpy, views
from batchtool.io.dataset import Dataset, Shard
from batchtool.core.errors import BatchtoolError, InputError, UsageError
from batchtool.io.formats.base import Piece, ReadTask, Stacked, StoredBatches, batch_of, size_problem
from batchtool.io.formats.registry import FORMATS
from batchtool.io.inputs import open_dataset
from batchtool.io.load_padding import READ_AHEAD_PADDED_BYTES, LoadPadding
from batchtool.loader.writer import fixed
from batchtool.ops.written import Written, written_by, written_names
from batchtool.loader.order import Resume, epoch_order, rank_count, rank_positions, resume
from batchtool.loader.receipts import Receipt, ReceiptLog
from batchtool.io.manifest import MANIFEST_NAME, manifest_path, output_files, schema_from_json
from batchtool.io.manifest_reader import read_manifest
from batchtool.core.runner import default_threads, threaded_map

__all__ = ["Loader", "column_to_numpy", "epoch_order", "load", "rank_positions", "to_numpy"]

READ_BATCHES = 32
"""Batches of the stream per task of the reading threads, decoded in one call where they are consecutive in one
file: amortises the per-call cost of small row groups and the per-task cost of the threads. An iteration starts
with 1, 2, 4, ... so the first batch (after a resume, say) costs one batch's read."""


# --- where batches live -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    """Each file's batches, numbered in file order, and where they are in the files' format."""

    paths: tuple[str, ...]
    counts: np.ndarray
    batches: StoredBatches

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def where(self, batch: int) -> str:
        """'FILE, batch N' of global batch `batch`, for errors."""
        file, local = self.locate(np.array([batch], dtype=np.int64))
        return f"{self.paths[int(file[0])]}, batch {int(local[0])}"

    def locate(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file, batch within the file) of global batch numbers (an empty file shares its start with the
        next file, and side='right' picks the last file starting at or before the batch: never an empty one)."""
        starts = np.cumsum(self.counts) - self.counts
        file = np.searchsorted(starts, batch, side="right") - 1
        return file, batch - starts[file]


@dataclass(frozen=True)
class _Reading:
    """The columns asked of an output, and how its stored batches become the batches handed out: as they are,
    or padded (`bucket --padding on-load`, LoadPadding) from the stored columns that padding needs too."""

    dataset: Dataset
    columns: list[str] | None
    padding: LoadPadding | None
    verify: bool
    """Check each batch's checksum as it is read, where the format only checks it when asked (Arrow IPC's
    CRC32C); Parquet pages and records of a stream are checked on every read."""

    @property
    def schema(self) -> pa.Schema:
        """Of the batches handed out."""
        full = self.dataset.schema if self.padding is None else self.padding.schema(self.dataset.schema)
        return full if self.columns is None else pa.schema([full.field(c) for c in self.columns])

    def read(self, batches: StoredBatches, file: int, local: np.ndarray, cache: dict) -> ReadTask:
        """The task reading file `file`'s batches `local` as stored (what padding needs among them)."""
        stored = self.columns if self.padding is None else self.padding.stored_columns(self.columns)
        return batches.read(file, local, stored, self.dataset.projected_schema(stored), cache, self.verify)

    def handed_out(self, batch: Piece, where: Callable[[], str]) -> Piece:
        """A stored batch as it is handed out: padded if stored at its real lengths (after its read's check)."""
        return batch if self.padding is None else self.padding.pad(batch_of(batch), self.columns, where)

    def padded_bytes(self, batch: Piece, where: Callable[[], str]) -> int:
        """What handed_out allocates padding a stored batch (0 where nothing is padded), learnt allocating nothing."""
        return 0 if self.padding is None else self.padding.padded_bytes(batch_of(batch), where)


class _Opened:
    """What the two ways of reading an output share (a Loader's stream, a Source's random access): the output
    opened, its columns asked and how they are handed out."""

    def __init__(self, reading: _Reading, layout: _Layout, writable: bool) -> None:
        self.dataset = reading.dataset
        self._reading = reading
        self._layout = layout
        self.columns = reading.columns
        self.writable = writable
        self.verify = reading.verify
        """Whether each batch's checksum is checked as it is read (see load's `verify`)."""

    @property
    def manifest(self) -> dict | None:
        """The output's manifest as a dict (None for a plain Parquet directory)."""
        return self.dataset.manifest

    @property
    def schema(self) -> pa.Schema:
        return self._reading.schema


@dataclass(frozen=True)
class _Unfinished:
    """A batch read but not yet padded or converted: that is done as the consuming thread hands it out."""

    batch: Piece


# --- the loader -------------------------------------------------------------------------------------------

class Loader(_Opened):
    """This rank's batches of DST, epoch by epoch: `for batch in loader` gives {column: array}.

    Also a PyTorch IterableDataset (whenever torch is imported, before or after `load`), so
    `DataLoader(loader, batch_size=None, num_workers=K)` splits the batches among its workers and
    yields them in the same order as the loader itself, and torchdata's `StatefulDataLoader` saves and
    restores each worker's copy exactly. A loader whose batches DataLoader workers read cannot tell where
    the training loop is: its state_dict() then needs `position=`. See `batchtool docs load`.
    """

    def __init__(self, reading: _Reading, layout: _Layout, writer: Written, *,
                 shuffle: bool, seed: int, rank: int, world_size: int, drop_uneven: bool, threads: int,
                 writable: bool, tensors: bool, receipt: str | None = None) -> None:
        super().__init__(reading, layout, writable)
        self._writer = writer
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_uneven = drop_uneven
        self.streams = writer.streams
        """Lane streams the output was written with (`segment --world-size`); 1 for independent batches."""
        self.threads = threads
        self.tensors = tensors
        self.receipt = receipt
        """The receipt file a line is appended to for each batch handed out (batchtool.loader.receipts); None: none."""
        self.epoch = 0
        self.position = 0
        """Batches of this epoch yielded so far (or where the next iteration resumes, after load_state_dict); in a
        DataLoader worker, where that worker's next batch is among this rank's."""
        self._start = 0
        """Batches of the epoch's order that ranks consumed before this run's (a resume on another world size)."""
        self._resume: Resume | None = None
        self._order: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None
        """The last epoch whose order was computed, with it (epoch_order)."""
        self._iterating = False
        self._pickled = False
        """This object was pickled (how a DataLoader sends it to spawned worker processes) since it last iterated."""
        self._forked = mmap.mmap(-1, 1)
        """One byte of memory shared with forked processes: a DataLoader worker forked from this process sets it
        as it iterates its copy of this loader (DataLoader.__init__ cannot tell us; the copy's memory is its own)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """isinstance() reads an object's __class__: PyTorch's DataLoader asking whether this is an IterableDataset
        registers Loader as one first, whenever torch was imported (torch is never imported here)."""
        _register_with_torch()
        return type(self)

    def __getstate__(self) -> dict[str, Any]:
        self._pickled = True
        state = self.__dict__.copy()
        del state["_forked"]
        state["_order"] = None  # (recomputed where needed: a worker need not receive a whole epoch's order)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _forked=mmap.mmap(-1, 1))

    def _read_by_workers(self) -> bool:
        """Whether DataLoader worker processes (or other processes it was pickled for) read this loader's batches
        since it last iterated itself: then its own position says nothing of where the training loop is."""
        return self._pickled or self._forked[0] != 0

    # metadata ---------------------------------------------------------------------------------------------

    @property
    def num_batches(self) -> int:
        """Batches in the whole output (every rank's)."""
        return self._layout.total

    @property
    def num_lanes(self) -> int | None:
        """Segment output: the lanes B (rows per batch, one per carried state); None for other outputs."""
        return int(self._writer.stats["lanes"]) if self._writer.lanes and "lanes" in self._writer.stats else None

    @property
    def batch_size(self) -> int | None:
        """Rows per batch when the writing command fixed one number, else None (per-bucket sizes,
        --max-tokens): `batch_index()["rows"]` has each batch's rows."""
        size = self.num_lanes or self._writer.option("batch_size")
        if isinstance(size, list) and len(size) == 1:
            size = size[0]
        if isinstance(size, str) and size.strip().isdigit():  # a pipeline's `batch-size = "32"`
            size = int(size)
        return size if isinstance(size, int) else None

    def batch_index(self, batches: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per batch, without reading any data: `batch` (its number in the output, files in order), `file`,
        `rows`, and for outputs with a `bucket` column (Parquet), `bucket`. Default: this rank's batches of
        the current epoch, in the order the loader yields them. Parses each file's footer once."""
        ids = self.epoch_batches() if batches is None else np.asarray(batches, dtype=np.int64)
        file, local = self._layout.locate(ids)
        rows = np.zeros(len(ids), dtype=np.int64)
        bucket = np.full(len(ids), -1, dtype=np.int64)
        where = self._layout.batches
        column = written_names(self.manifest, manifest_path(self.dataset.src)).get("bucket", "bucket")
        has_bucket = column in self.dataset.schema.names and where.records_buckets
        for f in np.unique(file):
            at = np.flatnonzero(file == f)
            rows[at] = where.rows(int(f), local[at])
            if has_bucket:
                bucket[at] = where.buckets(int(f), local[at], column)
        out = {"batch": ids, "file": file, "rows": rows}
        if has_bucket:
            out["bucket"] = bucket
        return out

    # epochs, ranks, resume ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank reads in this epoch (fewer in an epoch resumed on another world size)."""
        return rank_count(self.num_batches, self.world_size, self.drop_uneven, self._start)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (its order), as DistributedSampler.set_epoch; call it on every rank before each
        epoch. Setting the epoch a state was loaded for keeps the resume position."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.position = self._start = 0
            self._resume = None
            self._iterating = False

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """Where this rank is: a few JSON-serialisable numbers. Under a plain DataLoader with workers this object
        does not see what they read (each reads its own copy, ahead of the training loop): pass `position`, the
        batches of this epoch the training loop has consumed; without it that is a UsageError, not position 0.
        (torchdata's StatefulDataLoader asks each worker's copy, which answers for itself.)"""
        worker, workers = _worker_split()
        if position is None and _worker_info() is None and self._read_by_workers():
            raise UsageError("state_dict(): DataLoader worker processes read this loader's batches, so it cannot "
                             "tell how many the training loop consumed; pass state_dict(position=N), N the batches "
                             "of this epoch consumed, or use torchdata's StatefulDataLoader, whose state_dict() asks "
                             "each worker")
        state = {"epoch": self.epoch, "position": 0, "seed": self.seed, "shuffle": self.shuffle,
                 "world_size": self.world_size, "drop_uneven": self.drop_uneven, "batches": self.num_batches,
                 "start": self._start}
        if position is not None:
            state["position"] = int(position)
        elif workers == 1:
            state["position"] = self.position
        else:  # a DataLoader worker's copy: its next batch, which only this worker resumes
            state["position"] = min(self.position if self._iterating else self._first(worker, workers), len(self))
            state.update(worker=worker, workers=workers)
        self._check_position(state["position"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken: the next iteration starts with the next batch, in O(1) (the order
        is recomputed, no batch before it is read). Every rank is at the same position, so one rank's state
        resumes all of them; for independent batches, also on another number of ranks (which then share the
        rest of the epoch)."""
        found = resume(state, self.state_dict(position=0), fixed(self._writer))
        if found.worker is not None and found.worker != _worker_split():
            raise UsageError(f"load_state_dict: the state is DataLoader worker {found.worker[0]} of "
                             f"{found.worker[1]}'s; load it through the StatefulDataLoader that saved it")
        self.epoch, self._start = found.epoch, found.start
        self._check_position(found.position)
        self.position = found.position
        self._resume = found
        self._iterating = False

    def _check_position(self, position: int) -> None:
        if not 0 <= position <= len(self):
            raise UsageError(f"position {position}: this rank has {len(self)} batches in this epoch")

    def epoch_batches(self, rank: int | None = None) -> np.ndarray:
        """The batch numbers this rank (or rank `rank` of the world size) reads in the current epoch, in order (no
        data is read; the epoch's order is computed once for every rank asked)."""
        rank = self.rank if rank is None else rank
        _check_ranks(self.dataset.src, rank, self.world_size, self._writer)
        order, _ = self._epoch()
        return order[self._rank_positions(rank)]

    def _epoch(self) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, epoch_order(self._layout.counts, self.seed, self.epoch, self.shuffle))
        return self._order[1]

    def _rank_positions(self, rank: int | None = None) -> np.ndarray:
        return rank_positions(self.num_batches, self.rank if rank is None else rank, self.world_size,
                              self.drop_uneven, self._start)

    def _first(self, worker: int, workers: int) -> int:
        """Where this iterator starts among the rank's positions: worker w of K at the resume position + w (it
        reads every K-th from there), unless the state loaded was this worker's own."""
        if self._resume is None:
            return worker
        return self._resume.position + (0 if self._resume.worker is not None else worker)

    # reading -----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The reading threads (or for uncompressed Arrow IPC, this thread) convert each batch to arrays; a copy of
        read-only memory (writable=True over a memory map) is made here, right after the batch's file was checked
        (see _batches)."""
        writable = self.writable or self.tensors
        unsliced = self._layout.batches.unsliced and self._reading.padding is None  # (a padded batch is made here)

        stacks = StackViews(writable, unsliced)

        def convert(batch: Piece, batch_id: int) -> dict[str, Any]:
            if isinstance(batch, Stacked):
                return stacks(batch, lambda: self._layout.where(batch_id))
            return views(batch, writable, lambda: self._layout.where(batch_id), unsliced)

        for arrays, _ in self._batches(convert):
            yield hand_out(arrays, writable, self.tensors)

    def __getitem__(self, index: object) -> Any:
        raise TypeError("a batchtool Loader is iterable, not indexable (batchtool.source(DST) is the map-style "
                        "view; PyTorch's DataLoader treats a Loader as an IterableDataset)")

    def record_batches(self) -> Iterator[pa.RecordBatch]:
        """The same batches as Arrow RecordBatches (for Arrow-native consumers)."""
        for batch, _ in self._batches():
            yield batch_of(batch)

    def _batches(self, convert: Callable[[Piece, int], Any] | None = None) -> Iterator[tuple[Any, int]]:
        """(batch, its number in the output) in this iterator's order, counting self.position; each batch
        `convert`ed (batch, number) -> item first where given: on the thread that read it, or on this one as it is
        handed out where a read decodes nothing and verifying it costs less than handing it to a thread
        (StoredBatches.in_place; its file checked just before), or where padding it on load there would pass the
        read-ahead's bound (READ_AHEAD_PADDED_BYTES, shared by the reads in flight)."""
        worker, workers = _worker_split()
        first = self._first(worker, workers)
        self._resume = None
        in_worker = _worker_info() is not None
        self._forked[0] = in_worker  # (a forked worker's copy shares this byte with the loader it was forked from)
        self._pickled &= in_worker
        order, blocks = self._epoch()
        picked = self._rank_positions()[first::workers]
        self.position, self._iterating = first, True
        inline = self._layout.batches.in_place(self.verify) and self._reading.padding is None
        threads = 1 if inline else self.threads
        # bytes of padded batches each read group may make: threaded_map holds threads + 1 groups' results, this
        # thread one more
        ahead = READ_AHEAD_PADDED_BYTES // (threads + 2)

        def finish(batch: Piece, batch_id: int) -> Any:
            batch = self._reading.handed_out(batch, lambda: self._layout.where(batch_id))
            return batch if convert is None else convert(batch, batch_id)

        def run(group: list[tuple[ReadTask, list[int]]]) -> tuple[list[tuple[ReadTask, list[int], list[Any]]],
                                                                 BaseException | None]:
            """Each read of the group with its batches, padded if stored unpadded and converted (unless `inline`,
            or past the group's share of the read-ahead: then as read, _Unfinished); a read that fails or a batch
            that does not convert ends the list, with the error the consumer raises after the batches before it
            (as if it had read and converted each itself)."""
            done: list[tuple[ReadTask, list[int], list[Any]]] = []
            room = -1 if inline else ahead
            try:
                for read, ids in group:
                    batches = read()
                    items: list[Any] = []
                    done.append((read, ids, items))
                    for batch, batch_id in zip(batches, ids):
                        if room >= 0:
                            read.check()
                            room -= self._reading.padded_bytes(batch, lambda: self._layout.where(batch_id))
                        items.append(finish(batch, batch_id) if room >= 0 else _Unfinished(batch))
            except BatchtoolError as exc:
                return done, exc
            return done, None

        reads = self._reads(order[picked], blocks[picked])
        log = ReceiptLog(self.receipt) if self.receipt is not None else None
        try:
            for done, error in threaded_map(run, reads, threads):
                for read, ids, items in done:
                    for item, batch_id in zip(items, ids):
                        read.check()
                        if isinstance(item, _Unfinished):
                            item = finish(item.batch, batch_id)
                        if log is not None:
                            log.append(Receipt.of(self, self.position, batch_id))
                        self.position += workers
                        yield item, batch_id
                if error is not None:
                    raise error
        finally:
            if log is not None:
                log.close()

    def _reads(self, ids: np.ndarray, blocks: np.ndarray) -> Iterator[list[tuple[ReadTask, list[int]]]]:
        """Groups of reads in stream order, one task for the reading threads each: READ_BATCHES consecutive
        batches of the stream (a read for each run of them in one file, with the batches' numbers), so a shuffled
        epoch, whose next batch is mostly in another file of the block, still reads many per task. An iteration
        starts with groups of 1, 2, 4, ... batches, so its first batch costs one batch's read. Footers (and
        files of records) stay open for one block (StoredBatches.release); a format whose reads are I/O of byte
        ranges does it here, in order."""
        if not len(ids):
            return
        file, local = self._layout.locate(ids)
        cuts = np.flatnonzero((file[1:] != file[:-1]) | (blocks[1:] != blocks[:-1])) + 1
        starts = np.concatenate([[0], cuts]).astype(np.int64)
        ends = np.concatenate([cuts, [len(ids)]]).astype(np.int64)
        where = self._layout.batches
        cache: dict = {}
        block = None
        group: list[tuple[ReadTask, list[int]]] = []
        size, wanted = 0, 1
        try:
            for a, b in zip(starts, ends):
                if blocks[a] != block:
                    if group:  # (a group reads the files of one block)
                        yield group
                        group, size = [], 0
                    block = blocks[a]
                    where.release(cache)
                s = a
                while s < b:
                    chunk = local[s:min(b, s + wanted - size)]
                    group.append((self._reading.read(where, int(file[s]), chunk, cache),
                                  ids[s:s + len(chunk)].tolist()))
                    s += len(chunk)
                    size += len(chunk)
                    if size == wanted:
                        yield group
                        group, size, wanted = [], 0, min(2 * wanted, READ_BATCHES)
            if group:
                yield group
        finally:
            where.release(cache)


def _worker_info() -> Any:
    """PyTorch's WorkerInfo inside a DataLoader worker process, else None; never imports torch."""
    data = sys.modules.get("torch.utils.data")
    return data.get_worker_info() if data is not None else None


def _worker_split() -> tuple[int, int]:
    """(this worker, workers) inside a PyTorch DataLoader worker process, else (0, 1)."""
    info = _worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def _register_with_torch() -> None:
    """Make Loader an IterableDataset for DataLoader, if torch is already imported (it is never imported here)."""
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(Loader, data.IterableDataset):
        data.IterableDataset.register(Loader)


# --- opening ----------------------------------------------------------------------------------------------

def load(dst: str, *, columns: Sequence[str] | None = None, shuffle: bool | None = None, seed: int = 0,
         rank: int = 0, world_size: int = 1, drop_uneven: bool = True, threads: int | None = None,
         writable: bool = True, tensors: bool = False, verify: bool | None = None,
         receipt: str | os.PathLike | None = None) -> Loader:
    """Open a batch-shard output (bucket, segment, balanced stratify, ...) for training; see `batchtool docs load`.

    shuffle (default: True where batches are independent and can be read in any order, False for segment
    output, `bucket --order sorted` and GZIP-compressed records, read only forward) permutes the batches per
    epoch (`set_epoch`); rank/world_size give each rank an equal, disjoint part of every epoch (drop_uneven: drop
    the remainder, else repeat batches to fill). `threads` decode ahead of the training loop (default: min(4,
    cores; uncompressed Arrow IPC, whose batches are views of a memory map, is read by the loop itself, checksums
    included where its batches average at most 1 MB); the batches are the same. verify (default: wherever the
    output records checksums) checks every batch's checksum as it is read (Arrow IPC's CRC32C; Parquet's page and
    each record's checksums are checked on every read): a damaged batch is a BatchtoolError naming its file and
    batch, never wrong values. verify=False skips it; verify=True refuses an output without checksums (Arrow IPC
    files without the manifest that records them, or written by an older batchtool).
    receipt: a file to which a line (epoch, step, rank, batch, ...) is appended for each batch handed out, by every
    run, resumed or not, on any world size (`batchtool check DST --receipts FILE --exactly-once` reads it).
    """
    dst = os.fspath(dst)
    reading, layout, writer = open_output(dst, columns, verify)
    _check_ranks(dst, rank, world_size, writer)
    shuffle = _shuffle(dst, shuffle, writer, layout.batches)
    return Loader(reading, layout, writer, shuffle=shuffle, seed=int(seed), rank=rank,
                  world_size=world_size, drop_uneven=drop_uneven, threads=threads or min(4, default_threads()),
                  writable=writable, tensors=tensors, receipt=None if receipt is None else os.fspath(receipt))


def open_output(dst: str, columns: Sequence[str] | None, verify: bool | None) -> tuple[_Reading, _Layout, Written]:
    """The output's dataset with the columns asked and how its batches are handed out, where its batches are and
    what wrote them: what load and source share. Reads the manifest and stats the files; parses no footer."""
    manifest = read_manifest(dst) if fs.is_dir(dst) else None
    dataset = _from_manifest(dst, manifest) if manifest and manifest.get("schema") else open_dataset(dst)
    recorded = (manifest or {}).get("output", {}).get("padding")
    padding = None if recorded is None else LoadPadding.of(recorded, dataset.schema, manifest_path(dst))
    cols = dataset.check_columns(columns) if padding is None else padding.check_columns(dataset, columns)
    layout = _layout(dst, dataset)
    unverifiable = layout.batches.unverifiable() if verify is not False else None
    if verify and unverifiable:
        raise UsageError(f"verify=True: {dst} has no batch checksums to verify: {unverifiable}")
    verify = not unverifiable if verify is None else verify
    return _Reading(dataset, cols, padding, verify), layout, written_by(dataset.manifest)


def _shuffle(dst: str, shuffle: bool | None, writer: Written, batches: StoredBatches) -> bool:
    """Whether to shuffle: as asked where the output allows it; by default wherever it can."""
    if writer.ranks is not None:
        if shuffle:
            raise UsageError(f"shuffle=True: {dst} is {writer.op} output laid out by step for --world-size "
                             f"{writer.ranks} (each step's rows balanced across the ranks), so its order cannot "
                             "change; pass shuffle=False (its rows are already in seeded random order)")
        return False
    if writer.lanes:
        if shuffle:
            raise UsageError(f"shuffle=True: {dst} is {writer.op} output, whose batches continue each other's lanes "
                             "(state is carried from batch to batch), so their order cannot change")
        return False
    unshuffled = batches.unshuffled()
    if shuffle and unshuffled:
        raise UsageError(f"shuffle=True: {dst} is {unshuffled}; pass shuffle=False to read it in file order")
    if shuffle is None and unshuffled:
        warnings.warn(f"{dst} is {unshuffled}: reading its batches in file order", stacklevel=3)
        return False
    return bool(shuffle) if shuffle is not None else writer.option("order") != "sorted"


def _check_ranks(dst: str, rank: int, world_size: int, writer: Written) -> None:
    if world_size < 1:
        raise UsageError(f"world_size={world_size}: must be at least 1")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank={rank}: must be in 0..{world_size - 1} for world_size={world_size}")
    fixed_by, ranks = fixed(writer), writer.ranks
    if ranks is not None and world_size != ranks and fixed_by is not None:
        raise UsageError(f"world_size={world_size}: {dst} is {fixed_by(ranks, world_size)}")
    streams = writer.streams
    if writer.lanes and world_size != streams:
        fix = (f"write it with `{writer.op} --world-size N` for N ranks" if streams == 1
               else f"load it with world_size={streams}")
        plural = "s" if streams > 1 else ""
        raise UsageError(f"world_size={world_size}: {dst} is {writer.op} output with {streams} lane stream{plural} "
                         f"(one per rank; lanes cannot be split across ranks); {fix}")


def _from_manifest(dst: str, manifest: dict) -> Dataset:
    """The output's files and schema as its manifest lists them, each file's size (one stat) checked against the
    manifest's and its batch count against what that size can hold, so no count the manifest gives sizes
    anything unchecked: no footer is parsed until iteration."""
    out = manifest["output"]
    spec = FORMATS[out["format"]]
    shards = []
    for i, f in enumerate(output_files(dst, manifest)):
        if not fs.is_file(f.path):
            raise InputError(f"{f.path}: listed in {manifest_path(dst)} but missing")
        size = fs.file_size(f.path)
        problem = size_problem(f.path, size, f.bytes)
        if problem:
            raise InputError(problem)
        if f.batches > spec.most_batches(size, out.get("compression")):
            raise InputError(f"{f.path}: {MANIFEST_NAME} lists {f.batches:,} batches, more than its {size:,} bytes can "
                             "hold; the manifest is not this file's")
        shards.append(Shard(i, f.path, size))
    return Dataset(dst, spec, tuple(shards), schema_from_json(manifest["schema"]),
                   options=spec.options_of(out), manifest=manifest)


def _layout(dst: str, dataset: Dataset) -> _Layout:
    """Where every batch is, as the output's format finds it (Format.open_batches)."""
    counts, batches = dataset.spec.open_batches(dst, dataset)
    return _Layout(tuple(s.path for s in dataset.shards), counts, batches)
