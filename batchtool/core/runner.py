"""Where per-item work runs: an Executor, chosen once per run (batchtool.exec.engines.executor) and passed to whatever
maps work over items.

`executor.map(fn, items)` yields fn's results in input order, which is what makes output bytes independent of
--threads and of the engine. The local executor (Threads) runs a reader thread, worker threads and the consuming
(writer) thread, joined by bounded queues, so a slow writer holds back reading (backpressure); the others
(batchtool.exec.engines) run fn in other processes with the same order and backpressure, and declare what their
workers share with the driver (Shares). The first error in input order stops everything and is raised in the
consumer; Ctrl-C does the same.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

T = TypeVar("T")
U = TypeVar("U")

_POLL_SECONDS = 0.1
_END = object()


def default_threads() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Shares:
    """What an executor's workers share with the driver: the one thing every strategy that depends on the engine
    asks (where the workspace is, whether exchanges hold their cells in memory, who writes the shards, what a
    task may plan to hold), so that an engine declares it once and never is a case anywhere else."""

    memory: bool
    """Its workers are the driver's threads: what a task makes or returns is already in the driver's memory, so
    exchanges may hold their cells there (batchtool.exec.held) and one writer on the driver appends every batch in
    order; False: results travel, so the tasks write the shards themselves (batchtool.exec.shards)."""
    disk: bool
    """Its workers see the driver's disk, so the workspace may be in --tmp-dir; False: they share only DST's storage
    and write their temporary files beside DST (batchtool.io.workspace)."""
    tasks: int
    """How many tasks run at once across its workers."""
    processes: bool
    """Its workers are processes of their own, each running one task at a time: functions and items travel
    pickled, and a task plans its memory for itself alone (ops.base.Context.tasks)."""

    @property
    def tasks_per_process(self) -> int:
        """Tasks that share one process's memory at once."""
        return 1 if self.processes else self.tasks


class Executor(Protocol):
    """Runs per-item functions: the local threads, a pool of local processes, or a cluster's workers."""

    name: str
    threads: int
    """The driver's threads (--threads): the local executor's workers, another's for work it keeps local."""

    @property
    def shares(self) -> Shares:
        """What its workers share with the driver (every engine-dependent strategy follows from it)."""
        ...

    def map(self, fn: Callable[[T], U], items: Iterable[T], window: int | None = None) -> Iterator[U]:
        """fn over items, results in input order, at most `window` items in flight (None: the executor's).
        An executor whose workers are processes pickles `fn` and the items."""
        ...

    def summary(self) -> dict[str, Any]:
        """What it reports about the run so far, for the manifest's `run` (nothing, for threads)."""
        ...

    def close(self) -> None:
        """Release what it started (a cluster connection, worker processes) once the run ends."""
        ...


@dataclass(frozen=True)
class Threads:
    """The local executor: `threads` worker threads. With one, everything runs in the calling thread, one item at a
    time: the baseline that --threads N is measured against, and the easiest to debug."""

    threads: int = 1
    name: ClassVar[str] = "local"

    @classmethod
    def start(cls, run: Any) -> Threads:
        """The executor of a run (core.run_settings.RunSettings): its --threads."""
        return cls(run.threads)

    @property
    def shares(self) -> Shares:
        """Everything: its workers are the driver's own threads."""
        return Shares(memory=True, disk=True, tasks=self.threads, processes=False)

    def map(self, fn: Callable[[T], U], items: Iterable[T], window: int | None = None) -> Iterator[U]:
        return threaded_map(fn, items, self.threads, window)

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


SERIAL = Threads(1)
"""Work in the calling thread (a default where no run's executor is at hand)."""


_reading = threading.local()
"""In a map's reader thread (see _feed): that map's stop event, so that a map consumed there (a source that maps)
stops with it."""


class _Abandoned(BaseException):
    """Raised in a map consumed by another map's reader thread once that map stopped: no one waits for its results,
    and its reader must not wait for them either (a worker may never return; see threaded_map)."""


class _SourceError:

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _feed(items: Iterable[T], out: queue.Queue, stop: threading.Event) -> None:
    """Reader thread: iterate the source (which may do I/O, or write spill files) into a bounded queue,
    until it ends or the consumer stops; then close it, so its own cleanup runs here and now."""
    source: Iterable[T] | None = None
    _reading.stop = stop
    try:
        source = iter(items)  # may raise too (an __iter__ that reads): the consumer must hear it, not wait
        for item in source:
            if not _put(out, item, stop):
                return
        _put(out, _END, stop)
    except BaseException as exc:  # surfaces in the consumer, in order
        _put(out, _SourceError(exc), stop)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _put(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put unless the consumer stops first (a full queue then never blocks the reader for good)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def threaded_map(fn: Callable[[T], U], items: Iterable[T], threads: int, window: int | None = None) -> Iterator[U]:
    """Threads.map: `threads` workers and at most `window` items in flight (read but not yet consumed), which
    bounds memory."""
    threads = max(1, int(threads))
    if threads == 1:
        yield from map(fn, items)
        return
    window = window or threads + 1
    stop = threading.Event()
    source: queue.Queue = queue.Queue(maxsize=max(2, threads))
    reader = threading.Thread(target=_feed, args=(items, source, stop), name="batchtool-reader", daemon=True)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="batchtool-worker")
    pending: deque[Future] = deque()
    reader.start()
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) < window:
                item = _get(source)
                if item is _END:
                    exhausted = True
                elif isinstance(item, _SourceError):  # raised after the items read before it
                    exhausted = True
                    pending.append(_failed(item.exc))
                else:
                    pending.append(pool.submit(fn, item))
            if not pending:
                return
            yield _result(pending.popleft())
    finally:
        stop.set()
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        if reader is not threading.current_thread():  # (a generator may be finalized on any thread)
            # the source may write temporary files: done before the caller removes them. A map it consumes stops too
            # (_check_reader) rather than wait for a worker of its own that may be in a call that never returns.
            reader.join()


def _failed(exc: BaseException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


def _get(source: queue.Queue) -> object:
    """Blocking get that still lets Ctrl-C through promptly, and stops when the map reading this one does."""
    while True:
        try:
            return source.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            _check_reader()


def _result(fut: Future) -> U:
    while True:
        try:
            return fut.result(timeout=_POLL_SECONDS)
        except TimeoutError:
            _check_reader()


def _check_reader() -> None:
    """Stop waiting if this thread is the reader of a map that stopped."""
    stop = getattr(_reading, "stop", None)
    if stop is not None and stop.is_set():
        raise _Abandoned
