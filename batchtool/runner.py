"""Where per-item work runs: the local engine's threads, or the engine made active for a run.

Every operation reaches parallelism through `ordered_map(fn, items, threads)`. By default it runs
the local engine: a reader thread, worker threads and the consuming (writer) thread, joined by
bounded queues, so a slow writer holds back reading (backpressure). Inside `use_engine(engine)`
(what `--engine ray` sets up, see batchtool.engines) the same call runs `fn` on that engine
instead. Either way results come out in input order, which is what makes output bytes
independent of --threads and of the engine. The first error in input order stops everything and
is raised in the consumer; Ctrl-C does the same.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Protocol, TypeVar

T = TypeVar("T")
U = TypeVar("U")

_POLL_SECONDS = 0.1
_END = object()


def default_threads() -> int:
    return os.cpu_count() or 1


# -- engines -----------------------------------------------------------------------------------------------


class Engine(Protocol):
    """Runs per-item functions somewhere else than the local threads (e.g. a Ray cluster)."""

    name: str

    def map(self, fn: Callable[[T], U], items: Iterable[T], threads: int, window: int | None) -> Iterator[U]:
        """fn over items, results in input order, at most `window` items in flight (None: the engine's);
        `threads` is what the local engine would use (e.g. for work the engine keeps local)."""
        ...


_ACTIVE: ContextVar[Engine | None] = ContextVar("batchtool_engine", default=None)


def active_engine() -> Engine | None:
    """The engine behind ordered_map in this context; None is the local engine (threads)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def use_engine(engine: Engine | None) -> Iterator[None]:
    """Run every ordered_map call inside the block on `engine` (None: local threads)."""
    token = _ACTIVE.set(engine)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def ordered_map(fn: Callable[[T], U], items: Iterable[T], threads: int,
                window: int | None = None) -> Iterator[U]:
    """Apply fn to items and yield the results in input order, on the active engine.

    Local engine: `threads` workers and at most `window` items in flight (read but not yet
    consumed), which bounds memory. With threads=1 everything runs in the calling thread, one
    item at a time: the baseline that --threads N is measured against, and the easiest to debug.
    The engine is looked up now, not when iteration starts, so a stream handed to another thread
    keeps the engine it was made under; and the local engine reads `items` in the caller's context,
    so a stream that makes its own maps only once read (a pipeline stage's) makes them on that engine.
    """
    engine = active_engine()
    if engine is not None:
        return engine.map(fn, items, threads, window)
    return threaded_map(fn, items, threads, window)


# -- the local engine: threads ----------------------------------------------------------------------------


class _SourceError:

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _feed(items: Iterable[T], out: queue.Queue, stop: threading.Event) -> None:
    """Reader thread: iterate the source (which may do I/O, or write spill files) into a bounded queue,
    until it ends or the consumer stops; then close it, so its own cleanup runs here and now."""
    source: Iterable[T] | None = None
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
    """The local engine's ordered_map (see there)."""
    threads = max(1, int(threads))
    if threads == 1:
        yield from map(fn, items)
        return
    window = window or threads + 1
    stop = threading.Event()
    source: queue.Queue = queue.Queue(maxsize=max(2, threads))
    # the reader runs in the caller's context: a stream whose maps start only when it is first read (a pipeline
    # stage's) then finds the caller's engine there, instead of falling back to local threads
    reader = threading.Thread(target=contextvars.copy_context().run, args=(_feed, items, source, stop),
                              name="batchtool-reader", daemon=True)
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
            reader.join()  # the source may write temporary files: done before the caller removes them


def _failed(exc: BaseException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


def _get(source: queue.Queue) -> object:
    """Blocking get that still lets Ctrl-C through promptly."""
    while True:
        try:
            return source.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue


def _result(fut: Future) -> U:
    while True:
        try:
            return fut.result(timeout=_POLL_SECONDS)
        except TimeoutError:
            continue
