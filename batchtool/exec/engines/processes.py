"""The process engine (`--engine processes`): per-item functions run in a pool of --threads worker processes on this
machine, results in input order.

Its workers share the driver's disk but not its memory (runner.Shares): the workspace stays in --tmp-dir, exchanges
spill their cells to files, and the tasks write the shards themselves (batchtool.exec.shards). Functions, items and
results travel as the Ray engine's do (engines/transport.py), so the bytes are the local engine's. The pool starts at
the first map (a command that fails early starts none) and serves the process's later runs with as many workers
too (a program calling the library run after run, the tests), until the process exits.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
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


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the driver (the terminal sends it to every process of the command): the driver
    stops the run and says so in one line, and no worker prints a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(fn: Packed, item: Packed) -> tuple[bool, Packed]:
    """The task body in a worker: (True, the result) or (False, the error's portable state), both packed."""
    try:
        return True, pack(unpack(fn)(unpack(item)))
    except Exception as exc:  # noqa: BLE001 (re-raised on the driver, in input order)
        return False, pack(portable(exc))


_pools: dict[int, ProcessPoolExecutor] = {}
"""The process's pools by their number of workers."""


def _pool(workers: int) -> ProcessPoolExecutor:
    """A pool of `workers` processes, started now unless one is running; its workers fork from a server that
    imported what the driver had (the package's modules a run's functions need), so they do not import it again."""
    pool = _pools.get(workers)
    if pool is None:
        context = multiprocessing.get_context(START_METHOD)
        context.set_forkserver_preload(sorted(name for name in sys.modules if name.startswith("batchtool.")))
        pool = _pools[workers] = ProcessPoolExecutor(workers, mp_context=context, initializer=_ignore_interrupts)
    return pool


class ProcessEngine:
    """A pool of `workers` local processes (the process's own, started at the first map)."""

    name = "processes"

    def __init__(self, workers: int) -> None:
        self.threads = max(1, workers)
        """Its worker processes (--threads)."""

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
        return self._map(pack(fn), items, window or WINDOW_PER_WORKER * self.threads)

    def _map(self, fn: Packed, items: Iterable[T], window: int) -> Iterator[U]:
        pool = _pool(self.threads)
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
                    _pools.pop(self.threads, None)
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
        """Nothing: a map cancels the tasks no one wants any more as it ends, and the pool serves the next run."""


_END = object()


__all__ = ["ProcessEngine"]
