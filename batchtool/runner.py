"""The local engine's stage runner: a reader thread, worker threads and the consuming (writer) thread.

Items flow through bounded queues, so a slow writer holds back reading (backpressure).
Results come out in input order whatever the thread count, which is what makes output
bytes independent of --threads. The first error in input order stops every thread and is
raised in the consumer; Ctrl-C does the same.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

_POLL_SECONDS = 0.1
_END = object()


def default_threads() -> int:
    return os.cpu_count() or 1


class _SourceError:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _feed(items: Iterable[T], out: queue.Queue, stop: threading.Event) -> None:
    """Reader thread: iterate the source (which may do I/O) into a bounded queue."""
    try:
        for item in items:
            while not stop.is_set():
                try:
                    out.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        out.put(_END)
    except BaseException as exc:  # surfaces in the consumer, in order
        out.put(_SourceError(exc))


def ordered_map(fn: Callable[[T], U], items: Iterable[T], threads: int,
                window: int | None = None) -> Iterator[U]:
    """Apply fn to items on `threads` workers and yield results in input order.

    At most `window` items are in flight (read but not yet consumed), which bounds memory.
    With threads=1 everything runs in the calling thread, one item at a time: the baseline
    that --threads N is measured against, and the easiest to debug.
    """
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
