"""`batchtool.load`: the batches of a batch-shard output for a training loop: epochs, ranks, exact resume, workers."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import fs, rng
from batchtool.dataset import Dataset, Shard, open_dataset
from batchtool.errors import InputError, UsageError
from batchtool.formats.base import Batches
from batchtool.manifest import manifest_path, output_files, read_manifest, schema_from_json
from batchtool.runner import default_threads, ordered_map
from batchtool.stats import is_sequence_type

READ_BATCHES = 32
"""Batches decoded per read call when consecutive batches of the stream are in one file: amortises the
per-call cost of small row groups. An iteration starts with runs of 1, 2, 4, ... so the first batch
(after a resume, say) costs one batch's read."""
SHUFFLE_BLOCK_BATCHES = 8192
"""A shuffled epoch permutes the files, then the batches within blocks of consecutive files (those starting
in each stretch of this many batches), so a reader holds the footers of one block, never the whole output's."""
LANE_COMMANDS = ("segment",)
"""Operations whose batches continue each other (lanes carry state): read in order, never shuffled."""
STATE_KEYS = ("seed", "shuffle", "world_size", "drop_uneven", "batches")
"""What a state must share with the loader it resumes: they fix the order."""


# --- the order of an epoch: pure functions of (seed, epoch, the output's layout) ------------------------------

def epoch_order(file_batches: Sequence[int], seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(batch numbers in the order epoch `epoch` visits them, the block of each), where batches are numbered
    in file order. Shuffled: a keyed permutation of the files, cut into blocks of about
    SHUFFLE_BLOCK_BATCHES batches, each block's batches permuted. No process state is involved, so the
    order is the same on any machine, for any rank, worker or thread count."""
    counts = np.asarray(file_batches, dtype=np.int64)
    file_of = np.repeat(np.arange(len(counts)), counts)
    if not shuffle:
        return np.arange(len(file_of), dtype=np.int64), file_of
    files = np.argsort(rng.permutation_keys(seed, f"load/files/{epoch}", np.arange(len(counts), dtype=np.uint64)))
    before = np.cumsum(counts[files]) - counts[files]
    block = np.empty(len(counts), dtype=np.int64)
    block[files] = before // SHUFFLE_BLOCK_BATCHES
    keys = rng.permutation_keys(seed, f"load/epoch/{epoch}", np.arange(len(file_of), dtype=np.uint64))
    order = np.lexsort((keys, block[file_of]))
    return order.astype(np.int64), block[file_of][order]


def rank_positions(batches: int, rank: int, world_size: int, drop_uneven: bool) -> np.ndarray:
    """Positions in the epoch order that rank `rank` reads: contiguous equal parts, so each rank reads few
    files. drop_uneven drops the last `batches % world_size` batches of the order; otherwise the order is
    extended cyclically from its start, so some batches are read twice (by different ranks)."""
    if batches == 0:
        return np.zeros(0, dtype=np.int64)
    per = batches // world_size if drop_uneven else -(-batches // world_size)
    return np.arange(rank * per, (rank + 1) * per, dtype=np.int64) % batches


# --- where batches live -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Writer:
    """The operation that wrote the batches, with its options and statistics: the command's own, or for a
    `run` pipeline its last stage's (whose options are keyed by flag name: `batch-size` becomes `batch_size`)."""

    op: str | None
    options: dict
    stats: dict

    @staticmethod
    def of(manifest: dict | None) -> _Writer:
        if not manifest:
            return _Writer(None, {}, {})
        options, stats = manifest.get("options") or {}, manifest.get("stats") or {}
        if manifest.get("command") != "run":
            return _Writer(manifest.get("command"), options, stats)
        stage = (options.get("stages") or [{}])[-1]
        return _Writer(stage.get("op"), {k.replace("-", "_"): v for k, v in stage.items()},
                       (stats.get("stages") or [{}])[-1])

    @property
    def lanes(self) -> bool:
        return self.op in LANE_COMMANDS

    @property
    def streams(self) -> int:
        """Lane streams (`segment --world-size`); 1 for independent batches and older outputs."""
        return int(self.stats.get("world_size") or 1) if self.lanes else 1


@dataclass(frozen=True)
class _Layout:
    """Each file's batches, numbered in file order, and where they are in the files' format."""

    paths: tuple[str, ...]
    counts: np.ndarray
    batches: Batches

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def locate(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file, batch within the file) of global batch numbers (an empty file shares its start with the
        next file, and side='right' picks the last file starting at or before the batch: never an empty one)."""
        starts = np.cumsum(self.counts) - self.counts
        file = np.searchsorted(starts, batch, side="right") - 1
        return file, batch - starts[file]


# --- the loader -------------------------------------------------------------------------------------------

class Loader:
    """This rank's batches of DST, epoch by epoch: `for batch in loader` gives {column: array}.

    Also a PyTorch IterableDataset (registered when torch is imported before `load`), so
    `DataLoader(loader, batch_size=None, num_workers=K)` splits the batches among its workers and
    yields them in the same order as the loader itself. See `batchtool docs load`.
    """

    def __init__(self, dataset: Dataset, layout: _Layout, writer: _Writer, columns: list[str] | None, *,
                 shuffle: bool, seed: int, rank: int, world_size: int, drop_uneven: bool, threads: int,
                 writable: bool, tensors: bool) -> None:
        self.dataset = dataset
        self._layout = layout
        self._writer = writer
        self.columns = columns
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_uneven = drop_uneven
        self.streams = writer.streams
        """Lane streams the output was written with (`segment --world-size`); 1 for independent batches."""
        self.threads = threads
        self.writable = writable
        self.tensors = tensors
        self.epoch = 0
        self.position = 0
        """Batches of this epoch yielded so far (or where the next iteration resumes, after load_state_dict)."""
        self._resume = 0
        _register_with_torch()

    # metadata ---------------------------------------------------------------------------------------------

    @property
    def manifest(self) -> dict | None:
        """The output's manifest as a dict (None for a plain Parquet directory)."""
        return self.dataset.manifest

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.projected_schema(self.columns)

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
        size = self.num_lanes or self._writer.options.get("batch_size")
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
        from batchtool.ops.names import written_names  # here: the ops import check, which imports load

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
        """Batches this rank reads in one epoch."""
        return len(self._rank_positions())

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (its order), as DistributedSampler.set_epoch; call it on every rank before each
        epoch. Setting the epoch a state was loaded for keeps the resume position."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.position = self._resume = 0

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """Where this rank is: a few JSON-serialisable numbers. With DataLoader workers, this object does not
        see what they read: pass `position`, the batches of this epoch the training loop has consumed."""
        position = self.position if position is None else int(position)
        self._check_position(position)
        return {"epoch": self.epoch, "position": position, "seed": self.seed, "shuffle": self.shuffle,
                "world_size": self.world_size, "drop_uneven": self.drop_uneven, "batches": self.num_batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken: the next iteration starts with the next batch, in O(1) (the order
        is recomputed, no batch before it is read). Every rank is at the same position, so one rank's state
        resumes all of them."""
        missing = [k for k in ("epoch", "position", *STATE_KEYS) if k not in state]
        if missing:
            raise UsageError(f"load_state_dict: the state has no {', '.join(missing)}; pass what state_dict() "
                             "returned")
        mine = self.state_dict()
        for key in STATE_KEYS:
            if state[key] != mine[key]:
                raise UsageError(f"load_state_dict: the state was saved with {key}={state[key]!r}, this loader has "
                                 f"{key}={mine[key]!r}; resuming would not continue the same order")
        self._check_position(int(state["position"]))
        self.epoch = int(state["epoch"])
        self.position = self._resume = int(state["position"])

    def _check_position(self, position: int) -> None:
        if not 0 <= position <= len(self):
            raise UsageError(f"position {position}: this rank has {len(self)} batches per epoch")

    def epoch_batches(self) -> np.ndarray:
        """The batch numbers this rank reads in the current epoch, in order (no data is read)."""
        order, _ = self._epoch()
        return order[self._rank_positions()]

    def _epoch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.streams > 1:
            file, _ = self._layout.locate(np.arange(self.num_batches))
            return np.arange(self.num_batches, dtype=np.int64), file
        return epoch_order(self._layout.counts, self.seed, self.epoch, self.shuffle)

    def _rank_positions(self) -> np.ndarray:
        if self.streams > 1:
            return np.arange(self.rank, self.num_batches, self.streams, dtype=np.int64)
        return rank_positions(self.num_batches, self.rank, self.world_size, self.drop_uneven)

    # reading -----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.record_batches():
            yield to_numpy(batch, writable=self.writable or self.tensors, tensors=self.tensors)

    def __getitem__(self, index: object) -> Any:
        raise TypeError("a batchtool Loader is iterable, not indexable; PyTorch's DataLoader treats it as an "
                        "IterableDataset when torch is imported before batchtool.load() is called")

    def record_batches(self) -> Iterator[pa.RecordBatch]:
        """The same batches as Arrow RecordBatches (for Arrow-native consumers)."""
        start, self._resume = self._resume, 0
        order, blocks = self._epoch()
        positions = self._rank_positions()
        worker, workers = _worker_split()
        picked = positions[start + worker::workers]
        self.position = start
        reads = self._reads(order[picked], blocks[picked])
        for batches in ordered_map(lambda read: read(), reads, self.threads):
            for batch in batches:
                self.position += 1
                yield batch

    def _reads(self, ids: np.ndarray, blocks: np.ndarray) -> Iterator[Callable[[], list[pa.RecordBatch]]]:
        """Read tasks in stream order: runs of up to READ_BATCHES consecutive batches of one file. Footers
        (and TFRecord files) stay open for one block; I/O of TFRecord ranges happens here, in order."""
        if not len(ids):
            return
        file, local = self._layout.locate(ids)
        cuts = np.flatnonzero((file[1:] != file[:-1]) | (blocks[1:] != blocks[:-1])) + 1
        starts = np.concatenate([[0], cuts]).astype(np.int64)
        ends = np.concatenate([cuts, [len(ids)]]).astype(np.int64)
        where = self._layout.batches
        cache: dict = {}
        block = None
        run = 1
        try:
            for a, b in zip(starts, ends):
                if blocks[a] != block:
                    block = blocks[a]
                    where.release(cache)
                s = a
                while s < b:
                    f = int(file[s])
                    chunk = local[s:min(b, s + run)]
                    s += run
                    run = min(2 * run, READ_BATCHES)
                    yield where.read(f, chunk, self.columns, self.schema, cache)
        finally:
            where.release(cache)


def _worker_split() -> tuple[int, int]:
    """(this worker, workers) inside a PyTorch DataLoader worker process, else (0, 1); never imports torch."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (info.id, info.num_workers) if info is not None else (0, 1)


def _register_with_torch() -> None:
    """Make Loader an IterableDataset for DataLoader, if torch is already imported (it is never imported here)."""
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(Loader, data.IterableDataset):
        data.IterableDataset.register(Loader)


# --- arrays -----------------------------------------------------------------------------------------------

def to_numpy(batch: pa.RecordBatch, writable: bool = False, tensors: bool = False) -> dict[str, Any]:
    """{column: array}: equal-length list columns -> [B, T, ...] (zero-copy for numbers without nulls),
    scalars -> [B], strings -> object arrays, ragged lists -> object arrays of per-row arrays.
    writable: numbers are writable views of the decoded buffers (a copy only if Arrow's buffer is
    immutable). tensors: numbers as torch tensors sharing that memory (torch.from_numpy)."""
    out = {name: column_to_numpy(batch.column(i), writable) for i, name in enumerate(batch.schema.names)}
    if tensors:
        import torch

        out = {name: torch.from_numpy(a) if a.dtype != object else a for name, a in out.items()}
    return out


def column_to_numpy(arr: pa.Array, writable: bool = False) -> np.ndarray:
    if not is_sequence_type(arr.type):
        return _leaf(arr, writable)
    dense = _dense(arr, writable)
    if dense is not None:
        return dense
    out = np.empty(len(arr), dtype=object)
    for i in range(len(arr)):
        out[i] = None if not arr[i].is_valid else column_to_numpy(arr[i].values, writable)
    return out


def _leaf(arr: pa.Array, writable: bool) -> np.ndarray:
    values = arr.to_numpy(zero_copy_only=False)
    if not writable or values.flags.writeable:
        return values
    data = arr.buffers()[1] if len(arr.buffers()) > 1 else None
    if (data is not None and data.is_mutable and not arr.null_count
            and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type))):
        return np.frombuffer(data, dtype=values.dtype, count=len(arr), offset=arr.offset * values.itemsize)
    return values.copy()


def _dense(arr: pa.Array, writable: bool) -> np.ndarray | None:
    """[N, T, ...] view of a list column whose rows all have T steps and no nulls, else None."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        steps = arr.type.list_size
        values = arr.values.slice(arr.offset * steps, len(arr) * steps)
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and (lengths != lengths[0]).any():
            return None
        steps = int(lengths[0]) if len(lengths) else 0
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    inner = column_to_numpy(values, writable)
    if inner.dtype == object and is_sequence_type(values.type):
        return None
    return inner.reshape(len(arr), steps, *inner.shape[1:])


# --- opening ----------------------------------------------------------------------------------------------

def load(dst: str, *, columns: Sequence[str] | None = None, shuffle: bool | None = None, seed: int = 0,
         rank: int = 0, world_size: int = 1, drop_uneven: bool = True, threads: int | None = None,
         writable: bool = True, tensors: bool = False) -> Loader:
    """Open a batch-shard output (bucket, segment, balanced stratify, ...) for training; see `batchtool docs load`.

    shuffle (default: True where batches are independent, False for segment output and `bucket
    --order sorted`) permutes the batches per epoch (`set_epoch`); rank/world_size give each rank an
    equal, disjoint part of every epoch (drop_uneven: drop the remainder, else repeat batches to fill).
    `threads` decode ahead of the training loop (default: min(4, cores)); the batches are the same.
    """
    dst = os.fspath(dst)
    manifest = read_manifest(dst) if fs.is_dir(dst) else None
    dataset = _from_manifest(dst, manifest) if manifest and manifest.get("schema") else open_dataset(dst)
    cols = dataset.check_columns(columns)
    layout = _layout(dst, dataset)
    writer = _Writer.of(dataset.manifest)
    _check_ranks(dst, rank, world_size, writer)
    if writer.lanes:
        if shuffle:
            raise UsageError(f"shuffle=True: {dst} is {writer.op} output, whose batches continue each other's lanes "
                             "(state is carried from batch to batch), so their order cannot change")
        shuffle = False
    elif shuffle is None:
        shuffle = writer.options.get("order") != "sorted"
    unshuffled = layout.batches.unshuffled()
    if shuffle and unshuffled:
        raise UsageError(f"shuffle=True: {dst} is {unshuffled}")
    return Loader(dataset, layout, writer, cols, shuffle=bool(shuffle), seed=int(seed), rank=rank,
                  world_size=world_size, drop_uneven=drop_uneven, threads=threads or min(4, default_threads()),
                  writable=writable, tensors=tensors)


def _check_ranks(dst: str, rank: int, world_size: int, writer: _Writer) -> None:
    if world_size < 1:
        raise UsageError(f"world_size={world_size}: must be at least 1")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank={rank}: must be in 0..{world_size - 1} for world_size={world_size}")
    streams = writer.streams
    if writer.lanes and world_size != streams:
        fix = ("write it with `segment --world-size N` for N ranks" if streams == 1
               else f"load it with world_size={streams}")
        plural = "s" if streams > 1 else ""
        raise UsageError(f"world_size={world_size}: {dst} is {writer.op} output with {streams} lane stream{plural} "
                         f"(one per rank; lanes cannot be split across ranks); {fix}")


def _from_manifest(dst: str, manifest: dict) -> Dataset:
    """The output's files and schema as its manifest lists them: no footer is parsed until iteration."""
    out = manifest["output"]
    shards = tuple(Shard(i, f.path, f.bytes) for i, f in enumerate(output_files(dst, manifest)))
    missing = [s.path for s in shards if not fs.is_file(s.path)]
    if missing:
        raise InputError(f"{missing[0]}: listed in {manifest_path(dst)} but missing")
    return Dataset(dst, out["format"], shards, schema_from_json(manifest["schema"]),
                   tfrecord_kind=out.get("tfrecord_kind"), manifest=manifest)


def _layout(dst: str, dataset: Dataset) -> _Layout:
    """Where every batch is, as the output's format finds it (Format.open_batches)."""
    counts, batches = dataset.spec.open_batches(dst, dataset)
    return _Layout(tuple(s.path for s in dataset.shards), counts, batches)
