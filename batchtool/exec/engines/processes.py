"""The process engine (`--engine processes`): per-item functions run in a pool of --threads worker processes on this
machine, results in input order.

Its workers share the driver's disk but not its memory (runner.Shares): the workspace stays in --tmp-dir, exchanges
spill their cells to files, and the tasks write the shards themselves (batchtool.exec.shards). Functions, items and
results travel as the Ray engine's do (engines/transport.py), so the bytes are the local engine's. The pool starts at
the first map (a command that fails early starts none) and its processes end with the run.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from batchtool.core.errors import EngineError
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Shares
from batchtool.exec.engines.transport import Packed, pack, portable, rebuild, unpack

T = TypeVar("T")
U = TypeVar("U")

WINDOW_PER_WORKER = 2
"""Tasks in flight per worker process: one running and one queued, so no worker waits for the driver."""
START_METHOD = "forkserver"
"""How workers start: from a clean server process, never a fork of the driver's threads (a fork copies their locks
in whatever state they are)."""


def _run(fn: Packed, item: Packed) -> tuple[bool, Packed]:
    """The task body in a worker: (True, the result) or (False, the error's portable state), both packed."""
    try:
        return True, pack(unpack(fn)(unpack(item)))
    except Exception as exc:  # noqa: BLE001 (re-raised on the driver, in input order)
        return False, pack(portable(exc))


class ProcessEngine:
    """A pool of `workers` local processes, started at the first map."""

    name = "processes"

    def __init__(self, workers: int) -> None:
        self.threads = max(1, workers)
        """Its worker processes (--threads)."""
        self._pool: ProcessPoolExecutor | None = None

    @classmethod
    def start(cls, run: RunSettings) -> ProcessEngine:
        return cls(run.threads)

    @property
    def shares(self) -> Shares:
        """The driver's disk, not its memory: --threads processes, one task each at a time."""
        return Shares(memory=False, disk=True, tasks=self.threads, processes=True)

    def map(self, fn: Callable[[T], U], items: Iterable[T], window: int | None = None) -> Iterator[U]:
        """fn over items in the worker processes, at most `window` in flight, results in input order; the first
        error in input order is raised here as the same exception."""
        if self._pool is None:
            context = multiprocessing.get_context(START_METHOD)
            context.set_forkserver_preload([__name__])  # each worker forks with the package and pyarrow imported
            self._pool = ProcessPoolExecutor(self.threads, mp_context=context)
        return self._map(self._pool, pack(fn), items, window or WINDOW_PER_WORKER * self.threads)

    def _map(self, pool: ProcessPoolExecutor, fn: Packed, items: Iterable[T], window: int) -> Iterator[U]:
        source = iter(items)
        pending: deque[Future] = deque()
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < window:
                    item = next(source, _END)
                    if item is _END:
                        exhausted = True
                    else:
                        pending.append(pool.submit(_run, fn, pack(item)))
                if not pending:
                    return
                try:
                    done, packed = pending.popleft().result()
                except BrokenProcessPool as exc:
                    raise EngineError(f"--engine processes: a worker process died ({exc})") from None
                if not done:
                    raise rebuild(unpack(packed), "a worker process")
                yield unpack(packed)
        finally:
            for fut in pending:
                fut.cancel()

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """End the worker processes without waiting for tasks no one wants any more (a run that failed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_END = object()


__all__ = ["ProcessEngine"]
