"""Run the batchtool command parked at a chosen moment, so a test can signal it exactly then.

`start_parked(where, *args)` starts `python parked_cli.py FD WHERE ARGS...` and returns once the
child is parked. WHERE is `import:MODULE` (park when MODULE is first imported: start-up, after
batchtool.entry set its handlers) or `pass:DESC` (park at the first progress update of the pass
named DESC, in the main thread: a first pass, a spill, the writing pass). Parked, the child
writes "parked" to file descriptor FD and blocks until a signal arrives; the signal's handler
then raises exactly as it would at that point of a real run. WHERE `worker:` instead blocks the
first task a worker thread of the local engine runs, for good, in a native call (a read of a pipe
nobody writes), as a long pyarrow or NumPy call would; the main thread waits for its result, where
a signal finds it. WHERE `ray-task:` makes every task of the Ray engine's maps sleep for an hour on its
worker, and parks nothing: the child says "parked" when the driver first waits for a task's result
(inside Ray's wait, where a signal's handler runs in Ray's C++ code). No test-only code lives in batchtool.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def start_parked(where: str, *args: object, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> subprocess.Popen:
    """The running child, parked at `where` (or failed: the assertion shows its stderr)."""
    r, w = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join([REPO, child_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(w), where, *map(str, args)],
                            pass_fds=[w], stderr=subprocess.PIPE, text=True, env=child_env, cwd=cwd)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 120)
        line = os.read(r, 64) if ready else b""
    finally:
        os.close(r)
    if line != b"parked\n":  # exited (EOF) or never got there
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the child did not park at {where}: exit {proc.returncode}, stderr:\n{err}")
    return proc


def _park(fd: int) -> None:
    """Tell the test, then wait for its signal without a race: set_wakeup_fd makes a signal that
    arrives before the read still end it, and the read's return lets the signal's handler run."""
    assert threading.current_thread() is threading.main_thread(), "parked outside the main thread"
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    os.write(fd, b"parked\n")
    while True:
        os.read(r, 1)


class _ParkOnImport:
    """A meta-path finder that finds nothing, but parks the first time `name` is imported."""

    def __init__(self, name: str, fd: int) -> None:
        self.name, self.fd = name, fd

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.name:
            sys.meta_path.remove(self)
            _park(self.fd)


def _park_at_pass(desc: str, fd: int) -> None:
    """Wrap batchtool.core.progress.bar so the pass named `desc` parks after its first update."""
    from batchtool.core import progress

    real_bar = progress.bar

    def bar(name: str, *args: object, **kwargs: object) -> object:
        made = real_bar(name, *args, **kwargs)
        if name == desc:
            update = made.update

            def update_then_park(n: float = 1) -> object:
                result = update(n)
                _park(fd)
                return result

            made.update = update_then_park
        return made

    progress.bar = bar


def _block_a_worker(fd: int) -> None:
    """Wrap the local engine's map so that the first task a worker thread runs tells the test, then blocks."""
    from batchtool.core import runner

    real_map = runner.threaded_map
    first = threading.Lock()

    def blocking(fn: object) -> object:
        def task(item: object) -> object:
            if threading.current_thread() is not threading.main_thread() and first.acquire(blocking=False):
                r, _ = os.pipe()
                os.write(fd, b"parked\n")
                os.read(r, 1)  # never returns: nothing is written to the pipe
            return fn(item)
        return task

    runner.threaded_map = lambda fn, *args, **kwargs: real_map(blocking(fn), *args, **kwargs)


def _block_then(fn: object, item: object) -> object:
    threading.Event().wait()  # blocks for good on a Ray worker (nothing sets it): Ray cancels the task when the
    return fn(item)           # driver's map stops


def _stall_ray_tasks(fd: int) -> None:
    """Wrap the Ray engine's map so that its tasks sleep, and its driver's first wait tells the test."""
    from batchtool.exec.engines import ray, ray_failures

    real_map, real_get = ray.RayEngine.map, ray_failures.Watch.get
    told = threading.Lock()

    def stalled_map(self: object, fn: object, *args: object, **kwargs: object) -> object:
        return real_map(self, functools.partial(_block_then, fn), *args, **kwargs)

    def telling_get(self: object, *args: object) -> object:
        if told.acquire(blocking=False):
            os.write(fd, b"parked\n")
        return real_get(self, *args)

    ray.RayEngine.map, ray_failures.Watch.get = stalled_map, telling_get


def _main() -> None:
    fd, where, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    kind, _, name = where.partition(":")
    if kind == "import":
        sys.meta_path.insert(0, _ParkOnImport(name, fd))
    elif kind == "pass":
        _park_at_pass(name, fd)
    elif kind == "worker":
        _block_a_worker(fd)
    elif kind == "ray-task":
        _stall_ray_tasks(fd)
    else:
        raise SystemExit(f"parked_cli.py: unknown WHERE {where!r}")
    sys.argv = ["batchtool", *args]
    from batchtool.entry import main

    main()


if __name__ == "__main__":
    _main()
