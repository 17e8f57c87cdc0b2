"""The Ray engine: per-item functions run as Ray tasks across a cluster; the driver keeps input order.

`RayEngine` is a run's executor (runner.Executor) under `--engine ray`. Its `map` pickles the function
once (cloudpickle: closures are fine) and puts it in the object store. Consecutive items are
grouped into tasks of about TASK_SECONDS each (one CPU per task); at most `window` tasks are in
flight (twice the cluster's CPUs) and results are taken in submission order, so the driver sees
exactly the sequence the local threads would produce, with the same backpressure: a slow writer
stops new submissions.

Items and results travel as pickles whose Arrow data is compacted to IPC messages and moved out
of band. Errors come back as values and are re-raised on the driver as the same exception type
(so `error: ...` and exit 2 are unchanged). Per-item functions are pure: statistics travel in
their results and the driver merges them in input order, so nothing needs shipping back besides.

When Ray itself gives up (a task's worker process died in every attempt, a node and the result it
held are gone, the raylet of the driver's own node died) the map raises one EngineError naming the
task's input and the nodes; what Ray's driver would print on stdout about the cluster goes to that
error and the manifest instead (batchtool.exec.engines.ray_failures).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager, suppress
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from batchtool.core.runner import Shares, threaded_map
from batchtool.exec.engines.ray_failures import TASK_RETRIES, Watch, nodes_named, task_words
from batchtool.core.errors import UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.engines.transport import Packed as _Packed, pack as _pack, portable as _portable, rebuild, \
    unpack as _unpack

try:
    import ray
except ImportError:  # the optional extra is not installed
    ray = None

NEEDS_RAY = "--engine ray needs the ray extra: pip install 'batchtool[ray]'"

T = TypeVar("T")
U = TypeVar("U")

WINDOW_PER_CPU = 2
"""Tasks in flight per cluster CPU: one running and one queued, so workers never wait for the driver."""
TASK_SECONDS = 0.05
"""Aim for tasks of about this long: Ray's per-task cost (a few ms) is then a few percent."""
MAX_GROUP = 64
"""Most items one task takes."""
GROUP_BYTES = 32 << 20
"""Items are grouped only up to about this many bytes per task, so the tasks in flight (the window)
hold a bounded amount of data however cheap the function is."""
LOCAL_PROBE_ITEMS = 16
"""Items run remotely before a function too cheap to be worth shipping is kept on the driver."""


# -- tasks ----------------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """What one task returns: the results of its items in order, the error that stopped it (if any,
    as _portable state), how long its items took, and the address of the node it ran on."""

    results: list
    error: tuple | None
    seconds: float
    node: str


def _run_group(fn: Callable[[T], U], packed: _Packed) -> _Packed:
    """The task body: fn over consecutive items, stopping at the first error (returned, not raised)."""
    started = time.perf_counter()
    results, error = [], None
    for item in _unpack(packed):
        try:
            results.append(fn(item))
        except Exception as exc:  # noqa: BLE001 (re-raised on the driver, in input order)
            error = _portable(exc)
            break
    return _pack(_Outcome(results, error, time.perf_counter() - started,
                          ray.util.get_node_ip_address()))


class _Schedule:
    """How one map sends its items, from what it measures as it goes.

    Group size: one item per task at first, then as many as fill about TASK_SECONDS at the speed
    measured so far, within GROUP_BYTES and MAX_GROUP, so per-task overhead stays small when items
    are small (bucket's batches) and large items still spread out. Local: once LOCAL_PROBE_ITEMS
    items show the function takes less time on a worker than the driver spends packing its items
    and unpacking its results (e.g. shuffle's write pass, which only hands batches to the writer),
    the rest run on the driver's threads, where the data already is.
    """

    def __init__(self) -> None:
        self.size = 1
        self.local = False
        self._bytes_per_item = 0.0
        self._items = 0
        self._worker_seconds = self._transfer_seconds = 0.0

    def sent(self, packed: _Packed, items: int, seconds: float) -> None:
        self._bytes_per_item = packed.nbytes / items
        self._transfer_seconds += seconds

    def received(self, outcome: _Outcome, items: int, seconds: float) -> None:
        self._transfer_seconds += seconds
        if outcome.error is not None or not items:
            return
        self._items += items
        self._worker_seconds += outcome.seconds
        by_time = TASK_SECONDS / max(outcome.seconds / items, 1e-6)
        by_bytes = GROUP_BYTES / max(self._bytes_per_item, 1.0)
        self.size = max(1, min(MAX_GROUP, int(min(by_time, by_bytes))))
        self.local = self._items >= LOCAL_PROBE_ITEMS and self._worker_seconds < self._transfer_seconds


CONNECT_SECONDS = 5.0


def _check_reachable(address: str, named: str) -> None:
    """Fail in seconds, not minutes, when nothing listens at a host:port address (Ray itself retries for
    several minutes). Addresses Ray resolves itself ('auto', 'local') are left to it."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise UsageError(f"{named}: cannot connect to a Ray cluster ({exc.strerror or exc})") from None


@dataclass
class Timings:
    """Where a Ray run's time and bytes went, as the driver sees them (recorded in the manifest's `run`)."""

    connect_seconds: float = 0.0
    """ray.init: starting the local cluster, or connecting."""
    tasks: int = 0
    items: int = 0
    local_items: int = 0
    """Items run on the driver's threads (functions too cheap to ship, see _Schedule)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    pack_seconds: float = 0.0
    """Driver time pickling items (Arrow data to IPC)."""
    wait_seconds: float = 0.0
    """Driver time blocked on results (workers busy, or transfers)."""
    unpack_seconds: float = 0.0
    worker_seconds: float = 0.0
    """Time the functions themselves took on the workers, summed over tasks."""
    tasks_by_node: dict[str, int] = field(default_factory=dict)
    """Tasks run on each node, by node address: where the work went."""
    tasks_cancelled: int = 0
    """Tasks sent whose results were no longer wanted (a pass that stops early: a pipeline reading the first chunk
    of a stage's input), cancelled; tasks = sum(tasks_by_node) + tasks_cancelled."""
    lost_on: list[str] = field(default_factory=list)
    """Nodes where Ray reported a worker process, or the node itself, lost during the command (their tasks were
    run again elsewhere), by node address."""

    def sent(self, packed: _Packed, items: int, started: float) -> float:
        seconds = time.perf_counter() - started
        self.tasks += 1
        self.items += items
        self.bytes_sent += packed.nbytes
        self.pack_seconds += seconds
        return seconds

    def received(self, packed: _Packed, outcome: _Outcome, waited: float, started: float) -> float:
        seconds = time.perf_counter() - started
        self.wait_seconds += started - waited
        self.bytes_received += packed.nbytes
        self.unpack_seconds += seconds
        self.worker_seconds += outcome.seconds
        self.tasks_by_node[outcome.node] = self.tasks_by_node.get(outcome.node, 0) + 1
        return seconds

    def counted_local(self, results: Iterator[U]) -> Iterator[U]:
        for result in results:
            self.local_items += 1
            yield result

    def lost(self, report: dict, ignore_prefix: bool = False) -> None:
        """In place of ray._private.worker.print_to_stdstream (see ray_failures): the nodes a report of Ray's to the
        driver says lost a worker process or died."""
        self.lost_on.extend(node for node in dict.fromkeys(nodes_named(report)) if node not in self.lost_on)

    def summary(self) -> dict[str, Any]:
        summary = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        summary["tasks_by_node"] = dict(sorted(self.tasks_by_node.items()))
        summary["lost_on"] = sorted(self.lost_on)
        return summary


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """ray.init installs Ray's own handler for SIGTERM in the driver, which prints a stack dump and exits at once,
    leaving the temporary files behind; the program's handlers (batchtool's: a clean exit, one line) are put
    back, so a signal ends the command the way the program chose. Only the main thread may set them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


class RayEngine:
    """A connection to a Ray cluster (an existing one at `address`, or a local one started here)."""

    name = "ray"

    def __init__(self, address: str | None = None, local_cpus: int | None = None) -> None:
        if ray is None:
            raise UsageError(NEEDS_RAY)
        self.address = address
        self.threads = max(1, local_cpus or 1)
        """The driver's threads, for work the engine keeps local."""
        self.local_cpus = local_cpus
        self._started = False
        self._task: Any = None
        self.timings = Timings()
        self._watch = Watch(self.timings.lost_on)

    @classmethod
    def start(cls, run: RunSettings) -> RayEngine:
        """The Ray executor of a run (--ray-address, or a local cluster of --threads CPUs)."""
        return cls(run.ray_address, local_cpus=run.threads)

    def _connect(self) -> None:
        """Join the session in progress, or connect to `address`, or start a local cluster with
        `local_cpus` CPUs (--threads). Lazily, so a command that fails early starts nothing."""
        if self._task is not None:
            return
        if not ray.is_initialized():
            env = os.environ.get("RAY_ADDRESS")
            named = f"--ray-address {self.address}" if self.address else f"RAY_ADDRESS={env}" if env else None
            if named:
                _check_reachable(self.address or env, named)
            started = time.perf_counter()
            try:
                with _signal_handlers_kept():
                    ray.init(address=self.address, num_cpus=None if named else self.local_cpus,
                             include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                what = f"{named}: cannot connect to a Ray cluster" if named else "cannot start a local Ray cluster"
                raise UsageError(f"{what} ({exc})") from exc
            self._started = True
            self.timings.connect_seconds = time.perf_counter() - started
        self._watch.start(self.timings.lost if self._started else None)  # Ray's reports: see ray_failures
        self._task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_run_group)

    @property
    def shares(self) -> Shares:
        """Its workers are processes on any machine of the cluster: they share only DST's storage with the driver;
        as many at once as the cluster has CPUs (before it is connected, which asking must not do: --threads)."""
        return Shares(memory=False, disk=False, tasks=self.cpus if self._task is not None else self.threads,
                      processes=True)

    @property
    def cpus(self) -> int:
        self._connect()
        with self._watch.calls("asking the cluster for its CPUs"):
            return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[T], U], items: Iterable[T], window: int | None = None) -> Iterator[U]:
        """fn over items as Ray tasks, results in input order. A function that cannot be pickled (it holds
        an open file or a generator, say) runs on the driver's threads instead, with a warning; so do
        the remaining items of one too cheap to ship (see _Schedule)."""
        self._connect()
        try:
            with self._watch.calls("sending a pass's function to the cluster"):
                fn_ref = ray.put(fn)
        except (TypeError, pickle.PicklingError) as exc:
            while exc.__cause__ or exc.__context__:  # Ray wraps the pickling error in a long report
                exc = exc.__cause__ or exc.__context__
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"warning: --engine ray: {getattr(fn, '__qualname__', type(fn).__name__)} cannot be sent to Ray "
                  f"workers ({reason}); it runs on local threads", file=sys.stderr)
            return threaded_map(fn, items, self.threads, window)
        return self._map(fn, fn_ref, items, window or WINDOW_PER_CPU * self.cpus)

    def _map(self, fn: Callable[[T], U], fn_ref: Any, items: Iterable[T], window: int) -> Iterator[U]:
        source = iter(items)
        schedule = _Schedule()
        pending: deque = deque()  # (ref, number of items, the task in an error's words)
        source_error: Exception | None = None
        exhausted = False
        sent = 0
        try:
            while True:
                while not (exhausted or schedule.local) and len(pending) < window:
                    group: list[T] = []
                    try:
                        for item in itertools.islice(source, schedule.size):
                            group.append(item)
                    except Exception as exc:  # raised after the results of the items read before it
                        source_error = exc
                    exhausted = source_error is not None or len(group) < schedule.size
                    if group:
                        task = task_words(group, sent)
                        sent += len(group)
                        started = time.perf_counter()
                        packed = _pack(group)
                        schedule.sent(packed, len(group), self.timings.sent(packed, len(group), started))
                        with self._watch.calls(task):
                            pending.append((self._task.remote(fn_ref, packed), len(group), task))
                if not pending:
                    break
                ref, count, task = pending.popleft()
                waited = time.perf_counter()
                packed = self._watch.get(ref, task)
                started = time.perf_counter()
                outcome: _Outcome = _unpack(packed)
                schedule.received(outcome, count, self.timings.received(packed, outcome, waited, started))
                yield from outcome.results
                if outcome.error is not None:
                    raise rebuild(outcome.error, "a Ray task")
        finally:
            self._watch.abandon([fn_ref, *(ref for ref, _, _ in pending)])
            for ref, _, _ in pending:
                self.timings.tasks_cancelled += 1
                if not self._watch.broken:
                    with suppress(Exception):  # already finished or gone: nothing to stop
                        ray.cancel(ref)
        if source_error is not None:
            raise source_error
        if not exhausted:
            yield from self.timings.counted_local(threaded_map(fn, source, self.threads, window))

    def summary(self) -> dict[str, Any]:
        return {self.name: self.timings.summary()}

    def close(self) -> None:
        """Disconnect from the cluster this engine connected to, stopping it if it was the local one started
        here; a session that was already running in this process is left as it was. A session whose local raylet
        died is left alone (Ray's exit handler too): any call could end the process before the error is out."""
        if self._started:
            if self._watch.broken:
                atexit.unregister(ray.shutdown)
            else:
                ray.shutdown()
            self._watch.stop()
            self._started = False
        self._task = None


__all__ = ["RayEngine", "Timings"]
