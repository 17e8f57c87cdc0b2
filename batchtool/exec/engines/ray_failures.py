"""When Ray loses what the Ray engine runs on: one error line, a clean stdout, a process that ends as batchtool says.

Ray runs a task again when its worker process or its node dies (TASK_RETRIES times). The driver's side of that:

- When Ray stops trying (every attempt's worker process died, a node took a result with it), or the raylet of the
  driver's own node dies, the map raises one EngineError naming the task's input and the nodes Ray reported lost;
  the command ends like any other failure: one `error:` line, exit 2, its temporary files removed.
- The raylet of the driver's own node holds the object store the driver reads and writes. When it dies, Ray ends
  the driver's process at its next use of that store (its C++ QuickExit: no Python code runs, exit status 1, every
  temporary file left behind), and its core worker keeps logging on stderr and crashes in the interpreter's
  teardown. So the driver looks at that raylet before each Ray call and while it waits for a result, and stops
  first: from then on nothing touches Ray (no call, not even releasing an object reference), Ray's C++ log lines
  on stderr go to /dev/null, and the program ends without finalizing Ray once its line is out
  (skip_finalizing). The cleanup runs first, in the command's own unwinding.
- Ray's driver prints the cluster's reports (a worker process or a raylet that died, with its last 20 log lines;
  a task it will run again) on stdout, whatever log_to_driver says. While a session the engine started lasts,
  they come here instead: the nodes they name go in the manifest (run.ray.lost_on) and in the error.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from batchtool.exec.engines.finalizing import skip_finalizing
from batchtool.core.errors import EngineError

try:
    import ray
except ImportError:  # the optional extra is not installed: nothing here is reached without it
    ray = None

TASK_RETRIES = 3
"""How many times Ray runs a task again after losing its worker process or its node (Ray's default, set here
because the error that follows names the attempts)."""
WAIT_SECONDS = 0.05
"""While the driver waits for a result, how often it looks at its own node's raylet."""
_LOST_ON = re.compile(r"(?:Worker IP address:|Node IP:|and address:)\s*([^\s,]+)")
"""Where Ray's reports of a lost worker process or node name the node."""
_ABANDONED: list = []
"""Object references of a session whose local raylet died, never released: releasing one reaches for the dead
object store, where Ray ends the process."""


def nodes_named(report: dict) -> list[str]:
    """The nodes a report of Ray's to the driver (what ray._private.worker.print_to_stdstream takes) says lost a
    worker process or died."""
    return [node for line in report.get("lines", ()) for node in _LOST_ON.findall(line)]


@dataclasses.dataclass(frozen=True)
class LocalRaylet:
    """The raylet of the node the driver runs on, found by its socket on its command line (/proc); where /proc does
    not show it (another system, another PID namespace) its pid is None, nothing is looked at, and Ray's own
    behaviour remains."""

    address: str | None
    pid: int | None

    @classmethod
    def find(cls) -> LocalRaylet:
        node = getattr(ray._private.worker.global_worker, "node", None)
        if node is None:  # a Ray Client session (ray://): no raylet here
            return cls(None, None)
        return cls(node.node_ip_address, _pid_of(f"--raylet_socket_name={node.raylet_socket_name}".encode()))

    def alive(self) -> bool:
        if self.pid is None:
            return True
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state not in (b"Z", b"X")  # a zombie has died: its parent has not collected it yet


def _pid_of(argument: bytes) -> int | None:
    """The process with this argument on its command line, if /proc shows one."""
    with suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with suppress(OSError), open(os.path.join(entry.path, "cmdline"), "rb") as f:
                    if argument in f.read().split(b"\0"):
                        return int(entry.name)
    return None


def _paths(obj: Any, depth: int = 0) -> Iterator[str]:
    """The files an item names: a `path` it holds (a read task's shard has one), or one of its tuple elements'
    or dataclass fields', a few levels down."""
    path = getattr(obj, "path", None)
    if isinstance(path, str):
        yield path
    elif depth < 4:
        if isinstance(obj, (tuple, list)):
            parts = obj[:8]
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            parts = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        else:
            return
        for part in parts:
            yield from _paths(part, depth + 1)


def task_words(items: list, first: int) -> str:
    """A task as an error names it: by the files its items read, else by their place in the pass."""
    paths = list(dict.fromkeys(itertools.islice((p for item in items for p in _paths(item)), 64)))
    if not paths:
        return f"the task of items {first}-{first + len(items) - 1} of its pass"
    more = f" and {len(paths) - 2} more" if len(paths) > 2 else ""
    return f"the task reading {', '.join(paths[:2])}{more}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _signalled(exc: SystemError) -> BaseException | None:
    """What a signal's handler raised, if `exc` is Ray's wrapping of it (else None). Ray's C++ code runs the
    program's signal handlers while it waits (check_signals) and stops only for KeyboardInterrupt: what any other
    handler raises (the command line's Interrupted, for SIGTERM and SIGINT) is left pending, and comes out of
    the Ray call as "SystemError: ... returned a result with an exception set", caused by it."""
    cause = exc.__cause__
    return cause if isinstance(cause, BaseException) and not isinstance(cause, Exception) else None


def _silence_stderr_fd() -> None:
    """From here to the end of the process, what is written to fd 2 (Ray's C++ log lines) goes to /dev/null, and the
    program's stderr, when it is fd 2 (the command line's; not a test's capture), to a copy of the real one."""
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    sys.stderr.flush()
    kept = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = open(kept, "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)


class Watch:
    """The failures of one Ray session, as the driver sees them."""

    def __init__(self, lost_on: list[str]) -> None:
        self.lost_on = lost_on
        """The nodes Ray reported lost (the engine's Timings.lost_on)."""
        self.raylet: LocalRaylet | None = None
        self.broken = False
        """The local raylet died: no Ray call may follow, not even a release."""
        self._printer: Callable[..., None] | None = None

    def start(self, heard: Callable[..., None] | None) -> None:
        """After connecting: find the local raylet; Ray's reports to the driver go to `heard` (for a session the
        engine started; None: a session of the caller's, left as it prints)."""
        self.raylet = LocalRaylet.find()
        if heard is not None:
            self._printer, ray._private.worker.print_to_stdstream = ray._private.worker.print_to_stdstream, heard

    def stop(self) -> None:
        """After ray.shutdown (which joins the thread that prints Ray's reports): they print again. A broken session
        is never shut down, and its reports stay here."""
        if self._printer is not None and not self.broken:
            ray._private.worker.print_to_stdstream, self._printer = self._printer, None

    @contextmanager
    def calls(self, task: str) -> Iterator[None]:
        """Ray calls for `task` (the words an error names it by): a dead local raylet, or Ray giving up, becomes one
        EngineError; a signal's exception that Ray wrapped is raised as itself (_signalled)."""
        self.check(task)
        try:
            yield
        except ray.exceptions.LocalRayletDiedError:
            self.check(task, dead=True)
        except ray.exceptions.RayError as exc:
            raise EngineError(f"--engine ray: {self._gave_up(exc, task)}") from exc
        except SystemError as exc:
            signalled = _signalled(exc)
            if signalled is None:
                raise
            raise signalled from None

    def check(self, task: str, dead: bool = False) -> None:
        """Stop, with an error, if the local raylet died (see the module's docstring)."""
        if dead or (self.raylet is not None and not self.raylet.alive()):
            if not self.broken:
                self.broken = True
                _silence_stderr_fd()
                skip_finalizing()
            node = f" ({self.raylet.address})" if self.raylet is not None and self.raylet.address else ""
            raise EngineError(f"--engine ray: the raylet of the Ray node this command runs on{node} died while "
                              f"{task} ran; the command cannot reach the cluster without it")

    def _gave_up(self, exc: Exception, task: str) -> str:
        lost = f" (lost on {', '.join(sorted(self.lost_on))})" if self.lost_on else ""
        if isinstance(exc, ray.exceptions.WorkerCrashedError):
            return f"Ray gave up on {task}: its worker process died in each of {1 + TASK_RETRIES} attempts{lost}"
        if isinstance(exc, ray.exceptions.RayTaskError):  # outside the task's own catch: e.g. unpickling its items
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            return f"{task} failed on its worker: {type(cause).__name__}: {_first_line(cause)}"
        return f"Ray gave up on {task}: {_first_line(exc)}{lost}"

    def get(self, ref: Any, task: str) -> Any:
        """The task's result, looking at the local raylet while it waits."""
        with self.calls(task):
            while not ray.wait([ref], timeout=WAIT_SECONDS, fetch_local=False)[0]:
                self.check(task)
            self.check(task)
            return ray.get(ref)

    def abandon(self, refs: list) -> None:
        """Keep these references for good if the session broke (their release would reach the dead store)."""
        if self.broken:
            _ABANDONED.extend(refs)


__all__ = ["TASK_RETRIES", "LocalRaylet", "Watch", "nodes_named", "task_words"]
