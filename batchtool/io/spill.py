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
import functools
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa

from batchtool.core import fs, rng
from batchtool.io.dataset import Chunk
from batchtool.core.errors import OptionDestinationError

T = TypeVar("T")
ID_COLUMN = "__batchtool_id"
_FLUSH_BYTES = 4 << 20
MAX_OPEN_WRITERS = 256
"""Spill files open for writing at once, whatever the number of (group, part) cells (a small --memory
makes thousands): the least recently written cell's file is closed and it continues in a new file."""


def parts_for(group_bytes: float, budget_bytes: int) -> int:
    """How many parts keep one group's part under the budget."""
    return max(1, math.ceil(group_bytes / max(1, budget_bytes)))


class Cells(Protocol):
    """Where a Spill's (group, part) cells go as their buffers fill: files (SpillFiles), or memory while a budget
    allows (batchtool.exec.held.HeldCells). Either gives each cell's rows back in the order they were put."""

    def put(self, key: tuple[int, int], rows: pa.Table) -> None:
        """Append rows (of the spill's schema, in one chunk of their own) to cell `key`."""
        ...

    def finish(self) -> None:
        """Everything put is complete (files closed); call once, before reading."""
        ...

    def close(self) -> None:
        """Drop everything put (files removed), even after a failure."""
        ...

    def tables(self, group: int, part: int) -> list[pa.Table]:
        """A cell's rows, in the order they were put (after finish)."""
        ...


class SpillFiles:
    """Cells as Arrow IPC stream files in `directory` (which it removes on close): a cell's file continues until
    MAX_OPEN_WRITERS others were written since, then the cell continues in a new file."""

    def __init__(self, directory: str, schema: pa.Schema,
                 errors: Callable[[], AbstractContextManager[None]]) -> None:
        self.directory, self.schema, self._errors = directory, schema, errors
        self._writers: dict[tuple[int, int], pa.ipc.RecordBatchStreamWriter] = {}
        self._files: dict[tuple[int, int], int] = {}  # files written per (group, part), read back in order

    def _path(self, group: int, part: int, file: int) -> str:
        return os.path.join(self.directory, f"g{group:06d}-p{part:06d}-f{file:06d}.arrow")

    def put(self, key: tuple[int, int], rows: pa.Table) -> None:
        with self._errors():
            writer = self._writers.pop(key, None)  # re-inserted below: the dict runs from least to most recent
            if writer is None:
                if len(self._writers) >= MAX_OPEN_WRITERS:
                    self._writers.pop(next(iter(self._writers))).close()
                file = self._files.get(key, 0)
                self._files[key] = file + 1
                writer = pa.ipc.new_stream(pa.OSFile(self._path(*key, file), "wb"), self.schema)
            self._writers[key] = writer
            writer.write_table(rows)

    def finish(self) -> None:
        with self._errors():
            for writer in self._writers.values():
                writer.close()
        self._writers.clear()

    def close(self) -> None:
        """Remove every spill file, even when closing a writer fails (a full disk fails its last flush)."""
        try:
            for writer in self._writers.values():
                with suppress(OSError):
                    writer.close()
            self._writers.clear()
        finally:
            fs.remove_tree(self.directory)

    def paths(self, group: int, part: int) -> list[str]:
        """The files holding a (group, part) cell, in the order its rows were added (after finish)."""
        return [self._path(group, part, f) for f in range(self._files.get((group, part), 0))]

    def tables(self, group: int, part: int) -> list[pa.Table]:
        return [read_file(path) for path in self.paths(group, part)]


class Spill:
    """Rows scattered to (group, part) cells, by default files under `tmp_dir`, dropped on close even after a
    failure."""

    def __init__(self, schema: pa.Schema, parts_per_group: Sequence[int], seed: int, stage: str,
                 tmp_dir: str | None = None, flush_bytes: int = _FLUSH_BYTES,
                 cells: Callable[[pa.Schema], Cells] | None = None) -> None:
        """`cells(schema)`: where the cells go (default: SpillFiles in a new directory in tmp_dir)."""
        self.schema = schema.append(pa.field(ID_COLUMN, pa.uint64()))
        self.flush_bytes = flush_bytes
        """Bytes one (group, part) cell buffers before they are put; the cells' count times this bounds the buffers."""
        self.parts = list(parts_per_group)
        self.seed, self.stage = seed, stage
        self.cells = cells(self.schema) if cells is not None else SpillFiles(
            make_temporary_dir("batchtool-spill-", tmp_dir), self.schema,
            functools.partial(temporary_write_errors, tmp_dir))
        self._buffers: dict[tuple[int, int], list[pa.RecordBatch]] = {}
        self._buffered: dict[tuple[int, int], int] = {}
        self._unflushed = 0
        """Bytes of the chunks added since every buffer was last put: their buffered slices keep them alive."""
        self.rows = np.zeros(len(self.parts), dtype=np.int64)
        self.part_rows: dict[tuple[int, int], int] = {}
        """Rows per (group, part) cell."""

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.cells.close()

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
        self._unflushed += taken.nbytes
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
        if self._unflushed >= self.flush_bytes * max(1, sum(self.parts)):
            self._flush_all()

    def _flush(self, key: tuple[int, int]) -> None:
        pieces = self._buffers.pop(key, [])
        self._buffered.pop(key, None)
        if pieces:  # one copy of their own: the slices keep a whole chunk's buffers alive
            self.cells.put(key, pa.Table.from_batches(pieces, self.schema).combine_chunks())

    def _flush_all(self) -> None:
        """Put every buffer: a chunk stays alive while any slice of it is buffered, so what the buffers keep is the
        chunks added since this last ran, not their own bytes."""
        for key in list(self._buffers):
            self._flush(key)
        self._unflushed = 0

    def finish(self) -> None:
        """Flush every buffer and finish the cells; call once, before reading."""
        self._flush_all()
        self.cells.finish()

    def read_group(self, group: int, ordered: bool = True) -> Iterator[Chunk]:
        """The group's rows, one part at a time: sorted by the order key (the stage's keyed random
        permutation), or with ordered=False in the order they were added (a group of one part)."""
        for part in range(self.parts[group]):
            chunk = sort_part(self.cells.tables(group, part), self.seed, self.stage, ordered)
            if chunk is not None:
                yield chunk


def sort_part(tables: list[pa.Table], seed: int, stage: str, ordered: bool = True) -> Chunk | None:
    """The rows of one part, from its cells' tables (given in the order the rows were added; the list is
    emptied, so that they are freed once sorted), sorted by their keyed
    order key unless `ordered` is False; None if they hold no rows. The sort is stable, so the cells of several
    spills given in input order (the map outputs of batchtool.exec.exchange) read back exactly as one spill of the
    same rows would."""
    if not tables:
        return None
    table = pa.concat_tables(tables)
    tables.clear()
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


def read_file(path: str) -> pa.Table:
    """One spill file (an Arrow IPC stream), by memory map."""
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


__all__ = ["ID_COLUMN", "Cells", "Spill", "SpillFiles", "interleave", "key_range", "make_temporary_dir", "parts_for",
           "read_file", "sort_part", "temporary_write_errors"]
