"""What the local engine keeps in memory instead of spill files: an exchange's map outputs and sorted key ranges,
within a share of --memory that a run's exchanges take from together (Pool); beyond it they spill to files as on a
cluster, which changes nothing of the output (a cell's rows are the same rows in the same order wherever they lie)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa

from batchtool.core.runner import Executor
from batchtool.io.spill import Cells

HELD_SHARE = 4
"""A run's exchanges hold at most --memory / HELD_SHARE in memory, beside what their tasks hold as they work: key
ranges are sized so that the sorts under way take the rest (ops.keyed.RANGE_SHARE). Measured: `bucket` of the 200 MB
benchmark, half of --memory held, peaked at 1.3 GB under the default 1 GB."""


class Pool:
    """The bytes a run's exchanges may still hold in memory, taken and given back by its threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.most = 0
        """The most held at once (for tests and the curious)."""
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Whether `nbytes` more may be held (then they count as held until given back)."""
        with self._lock:
            if self.held + nbytes > self.limit:
                return False
            self.held += nbytes
            self.most = max(self.most, self.held)
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes


def pool_for(memory: int, executor: Executor) -> Pool | None:
    """The run's pool: a share of its --memory where the executor's workers share the driver's memory; None
    (everything through the workspace's files) where they are other processes."""
    return Pool(memory // HELD_SHARE) if executor.shares.memory else None


class HeldCells:
    """A map task's cells (batchtool.io.spill.Cells) in memory while the pool grants their bytes; once it refuses,
    every cell goes to the files `spilled(schema)` makes, what was held first, so each cell keeps its order."""

    def __init__(self, pool: Pool, spilled: Callable[[pa.Schema], Cells], schema: pa.Schema) -> None:
        self.pool, self._spilled, self.schema = pool, spilled, schema
        self._cells: dict[tuple[int, int], list[pa.Table]] = {}
        self._bytes: dict[tuple[int, int], int] = {}
        self.files: Cells | None = None
        """Where the cells went once the pool refused (None: all in memory)."""

    def put(self, key: tuple[int, int], rows: pa.Table) -> None:
        if self.files is None:
            if self.pool.take(rows.nbytes):
                self._cells.setdefault(key, []).append(rows)
                self._bytes[key] = self._bytes.get(key, 0) + rows.nbytes
                return
            self.files = self._spilled(self.schema)
            for held, tables in self._cells.items():
                for table in tables:
                    self.files.put(held, table)
            self._drop_all()
        self.files.put(key, rows)

    def finish(self) -> None:
        if self.files is not None:
            self.files.finish()

    def close(self) -> None:
        self._drop_all()
        if self.files is not None:
            self.files.close()

    def tables(self, group: int, part: int) -> list[pa.Table]:
        if self.files is not None:
            return self.files.tables(group, part)
        return list(self._cells.get((group, part), []))

    def drop(self, group: int, part: int) -> None:
        """Give a cell's memory back (once it is sorted)."""
        self._cells.pop((group, part), None)
        self.pool.give(self._bytes.pop((group, part), 0))

    def _drop_all(self) -> None:
        self._cells.clear()
        self.pool.give(sum(self._bytes.values()))
        self._bytes.clear()


__all__ = ["HELD_SHARE", "HeldCells", "Pool", "pool_for"]
