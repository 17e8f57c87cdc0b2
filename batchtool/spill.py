"""Spilling rows to temporary Arrow IPC files, so global reorders run in bounded memory.

Rows are scattered to (group, part) files: the group is what the operation asks for (a
bucket, a class, or one group for a global shuffle); the parts split a group too large for
memory into equal ranges of each row's keyed random order key. Reading a group back loads one
part at a time and sorts it by that key, so the group comes back sorted by the key: a uniformly
random permutation that is the same for any number of parts, that is for any --memory (and
any thread count, since rows are added in input order).

Example ids travel as the last column of a spill file and are found by position, never by
name, so an input column of any name (even `__batchtool_id`) cannot collide with them.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from typing import TypeVar

import numpy as np
import pyarrow as pa

from batchtool import fs, rng
from batchtool.dataset import Chunk
from batchtool.errors import OptionDestinationError

T = TypeVar("T")
ID_COLUMN = "__batchtool_id"
_FLUSH_BYTES = 4 << 20
MAX_OPEN_WRITERS = 256
"""Spill files open for writing at once, whatever the number of (group, part) cells (a small --memory
makes thousands): the least recently written cell's file is closed and it continues in a new file."""


def parts_for(group_bytes: float, budget_bytes: int) -> int:
    """How many parts keep one group's part under the budget."""
    return max(1, math.ceil(group_bytes / max(1, budget_bytes)))


class Spill:
    """Temporary (group, part) IPC files under `tmp_dir`, removed on close even after a failure."""

    def __init__(self, schema: pa.Schema, parts_per_group: Sequence[int], seed: int, stage: str,
                 tmp_dir: str | None = None, flush_bytes: int = _FLUSH_BYTES, directory: str | None = None,
                 errors: Callable[[], AbstractContextManager[None]] | None = None) -> None:
        """`directory`: an existing empty directory to write in (and remove on close) instead of a new one
        in tmp_dir; `errors`: what a refused write raises there (default: the tmp dir's error)."""
        self.schema = schema.append(pa.field(ID_COLUMN, pa.uint64()))
        self.flush_bytes = flush_bytes  # bytes one (group, part) buffers before writing; cells x this bounds memory
        self.parts = list(parts_per_group)
        self.seed, self.stage = seed, stage
        self.tmp_dir = tmp_dir
        self._write_errors = errors
        self.directory = directory or make_temporary_dir("batchtool-spill-", tmp_dir)
        self._writers: dict[tuple[int, int], pa.ipc.RecordBatchStreamWriter] = {}
        self._buffers: dict[tuple[int, int], list[pa.RecordBatch]] = {}
        self._buffered: dict[tuple[int, int], int] = {}
        self.rows = np.zeros(len(self.parts), dtype=np.int64)
        self.part_rows: dict[tuple[int, int], int] = {}
        """Rows per (group, part) cell."""
        self._files: dict[tuple[int, int], int] = {}  # files written per (group, part), read back in order

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every spill file, even when closing a writer fails (a full disk fails its last flush)."""
        try:
            for writer in self._writers.values():
                with suppress(OSError):
                    writer.close()
            self._writers.clear()
        finally:
            fs.remove_tree(self.directory)

    def _errors(self) -> AbstractContextManager[None]:
        return self._write_errors() if self._write_errors is not None else temporary_write_errors(self.tmp_dir)

    def _path(self, group: int, part: int, file: int) -> str:
        return os.path.join(self.directory, f"g{group:06d}-p{part:06d}-f{file:06d}.arrow")

    def add(self, chunk: Chunk, groups: np.ndarray) -> None:
        """Append each row of the chunk to its group's spill (call in a deterministic order)."""
        groups = np.asarray(groups, dtype=np.int64)
        max_parts = max(self.parts) if self.parts else 1
        parts = key_range(rng.permutation_keys(self.seed, self.stage, chunk.ids),
                          np.asarray(self.parts, dtype=np.uint64)[groups])
        cells = groups * max_parts + parts
        order = np.argsort(cells, kind="stable")
        sorted_cells = cells[order]
        starts = np.flatnonzero(np.r_[True, sorted_cells[1:] != sorted_cells[:-1]])
        ends = np.r_[starts[1:], len(order)]
        data = chunk.data.append_column(ID_COLUMN, pa.array(chunk.ids, pa.uint64()))
        taken = data.take(pa.array(order))
        for s, e in zip(starts, ends):
            cell = int(sorted_cells[s])
            key = (cell // max_parts, cell % max_parts)
            piece = taken.slice(s, e - s)
            self._buffers.setdefault(key, []).append(piece)
            self._buffered[key] = self._buffered.get(key, 0) + piece.nbytes
            self.rows[key[0]] += e - s
            self.part_rows[key] = self.part_rows.get(key, 0) + int(e - s)
            if self._buffered[key] >= self.flush_bytes:
                self._flush(key)

    def _flush(self, key: tuple[int, int]) -> None:
        pieces = self._buffers.pop(key, [])
        self._buffered.pop(key, None)
        if not pieces:
            return
        with self._errors():
            writer = self._writers.pop(key, None)  # re-inserted below: the dict runs from least to most recent
            if writer is None:
                if len(self._writers) >= MAX_OPEN_WRITERS:
                    self._writers.pop(next(iter(self._writers))).close()
                file = self._files.get(key, 0)
                self._files[key] = file + 1
                writer = pa.ipc.new_stream(pa.OSFile(self._path(*key, file), "wb"), self.schema)
            self._writers[key] = writer
            writer.write_table(pa.Table.from_batches(pieces, self.schema).combine_chunks())

    def finish(self) -> None:
        """Flush and close every writer; call once, before reading."""
        for key in list(self._buffers):
            self._flush(key)
        with self._errors():
            for writer in self._writers.values():
                writer.close()
        self._writers.clear()

    def paths(self, group: int, part: int) -> list[str]:
        """The files holding a (group, part) cell, in the order its rows were added (after finish)."""
        return [self._path(group, part, f) for f in range(self._files.get((group, part), 0))]

    def read_group(self, group: int, ordered: bool = True) -> Iterator[Chunk]:
        """The group's rows, one part at a time: sorted by the order key (the stage's keyed random
        permutation), or with ordered=False in the order they were added (a group of one part)."""
        for part in range(self.parts[group]):
            chunk = read_part(self.paths(group, part), self.seed, self.stage, ordered)
            if chunk is not None:
                yield chunk


def read_part(paths: Sequence[str], seed: int, stage: str, ordered: bool = True) -> Chunk | None:
    """The rows of one part's spill files (read in the order given, which is the order the rows were added),
    sorted by their keyed order key unless `ordered` is False; None if they hold no rows. The sort is stable,
    so files of several spills given in input order (the map outputs of batchtool.exchange) read back
    exactly as one spill of the same rows would."""
    if not paths:
        return None
    table = pa.concat_tables([_read(path) for path in paths])
    if table.num_rows == 0:
        return None
    last = table.num_columns - 1  # the ids (by position: a user column may share their name)
    ids = table.column(last).to_numpy()
    if ordered:
        order = np.argsort(rng.permutation_keys(seed, stage, ids), kind="stable")
        table = table.take(pa.array(order))
        ids = ids[order]
    data = table.remove_column(last).combine_chunks()
    return Chunk(data.to_batches()[0] if data.num_rows else data, np.ascontiguousarray(ids))


def make_temporary_dir(prefix: str, tmp_dir: str | None) -> str:
    """A new private directory for temporary files in tmp_dir (made if missing) or the system's; the caller
    removes it (fs.remove_tree). Every command's scratch files start here, so every one fails the same way."""
    with temporary_write_errors(tmp_dir):
        if tmp_dir is not None:
            os.makedirs(tmp_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=prefix, dir=tmp_dir)


@contextlib.contextmanager
def temporary_write_errors(tmp_dir: str | None) -> Iterator[None]:
    """The OS refusing a temporary file (no space, no permission) as one error naming the directory (and the
    option that chooses it, as each front end names it)."""
    try:
        yield
    except OSError as exc:
        where = (f"{{tmp_dir}} {tmp_dir}" if tmp_dir is not None
                 else f"{tempfile.gettempdir()} (the system's temporary directory; {{tmp_dir}} chooses another)")
        raise OptionDestinationError("tmp_dir", f"{where}: cannot write temporary files: {fs.os_reason(exc)}") from exc


def _read(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return pa.ipc.open_stream(source).read_all()


def key_range(keys: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """The part of each uint64 order key when the key space is cut into `parts` equal ranges (monotone
    in the key, so reading the parts in turn, each sorted, is sorting by the key)."""
    return ((keys >> np.uint64(32)) * np.asarray(parts, dtype=np.uint64) >> np.uint64(32)).astype(np.int64)


def interleave(streams: Sequence[Iterator[T]], counts: Sequence[int], seed: int, stage: str) -> Iterator[tuple[int, T]]:
    """Merge streams in a uniformly random interleaving that keeps each stream's own order.

    Step t takes from stream i with probability remaining_i / remaining_total, drawn from the
    keyed uniform of t, so the order depends only on the seed and the counts. `counts` must be
    how many items each stream yields.
    """
    remaining = np.asarray(counts, dtype=np.int64).copy()
    total = int(remaining.sum())
    for step in range(total):
        u = rng.uniform(seed, stage, np.array([step], dtype=np.uint64))[0]
        pick = int(np.searchsorted(np.cumsum(remaining), u * total, side="right"))
        remaining[pick] -= 1
        total -= 1
        yield pick, next(streams[pick])


__all__ = ["ID_COLUMN", "Spill", "interleave", "key_range", "make_temporary_dir", "parts_for", "read_part",
           "temporary_write_errors"]
