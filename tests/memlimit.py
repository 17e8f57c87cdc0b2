"""Run a command in a child process under a hard RSS cap, so a memory regression fails a test, not the machine.

A watchdog thread reads the child's peak resident set (VmHWM in /proc/<pid>/status) every few
milliseconds and kills it above the cap. Unlike RLIMIT_AS (which breaks pyarrow's allocator, as it
reserves address space it never touches) this bounds what the child really uses. The peak is taken
from wait4's rusage, so it is exact even for growth between two polls.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

_POLL_SECONDS = 0.005


@dataclass(frozen=True)
class Capped:
    """How a capped child ended: exit status (negative: killed by that signal), output, peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int
    killed_for_memory: bool

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / (1 << 20)


def _peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) << 10
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run_capped(args: Sequence[str], limit_bytes: int, *, env: dict[str, str] | None = None,
               timeout: float = 120.0, cwd: str | None = None) -> Capped:
    """Run args to completion, killing the child if its RSS passes limit_bytes or it outlives timeout."""
    killed = threading.Event()
    done = threading.Event()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(args), stdout=out, stderr=err, env=env, cwd=cwd)

        def watch() -> None:
            deadline = time.monotonic() + timeout
            while not done.is_set():
                if _peak_rss(proc.pid) > limit_bytes or time.monotonic() > deadline:
                    killed.set()
                    os.kill(proc.pid, signal.SIGKILL)
                    return
                done.wait(_POLL_SECONDS)

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
        done.set()
        watchdog.join()
        out.seek(0)
        err.seek(0)
        peak = usage.ru_maxrss << 10
        return Capped(proc.returncode, out.read(), err.read(), peak, killed.is_set() and peak > limit_bytes)


def batchtool(*args: str, limit_bytes: int, timeout: float = 120.0) -> Capped:
    """`python -m batchtool ARGS` from this checkout, capped."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return run_capped([sys.executable, "-m", "batchtool", *map(str, args)], limit_bytes, env=env, timeout=timeout)
