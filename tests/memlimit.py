"""Run a command in a child process under a hard RSS cap, so a memory regression fails a test, not the machine.

A watchdog thread reads the child's peak resident set (VmHWM in /proc/<pid>/status) every few
milliseconds and kills it above the cap. Unlike RLIMIT_AS (which breaks pyarrow's allocator, as it
reserves address space it never touches) this bounds what the child really uses. The peak reported is
the child's own VmHWM: written by the child as it exits where it can (`batchtool()` runs it that way),
else the largest the watchdog saw. Not wait4's ru_maxrss: a child started by vfork/exec inherits the
parent's high-water mark, so it would report the pytest process's size.
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
PEAK_FILE_VARIABLE = "BATCHTOOL_TEST_PEAK"
"""A child that writes its VmHWM (kB) to the file this names as it exits gives an exact peak."""
_PEAK_REPORTER = f"""
import os, runpy, sys
sys.argv[0] = "batchtool"
try:
    runpy.run_module("batchtool", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status, open(os.environ["{PEAK_FILE_VARIABLE}"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
"""


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
    seen = [0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".peak") as peak_file:
        child_env = {**(os.environ if env is None else env), PEAK_FILE_VARIABLE: peak_file.name}
        proc = subprocess.Popen(list(args), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                                cwd=cwd)

        def watch() -> None:
            deadline = time.monotonic() + timeout
            while not done.is_set():
                seen[0] = max(seen[0], _peak_rss(proc.pid))
                if seen[0] > limit_bytes or time.monotonic() > deadline:
                    killed.set()
                    os.kill(proc.pid, signal.SIGKILL)
                    return
                done.wait(_POLL_SECONDS)

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        proc.wait()
        done.set()
        watchdog.join()
        out.seek(0)
        err.seek(0)
        reported = peak_file.read().strip()
        peak = int(reported) << 10 if reported else seen[0]
        return Capped(proc.returncode, out.read(), err.read(), peak, killed.is_set() and seen[0] > limit_bytes)


def batchtool(*args: str, limit_bytes: int, timeout: float = 120.0, cwd: str | None = None,
              env: dict[str, str] | None = None) -> Capped:
    """`python -m batchtool ARGS` from this checkout, capped, reporting its exact peak (in os.environ, or env)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.environ if env is None else env
    env = {**base, "PYTHONPATH": repo + os.pathsep + base.get("PYTHONPATH", "")}
    return run_capped([sys.executable, "-c", _PEAK_REPORTER, *map(str, args)], limit_bytes, env=env,
                      timeout=timeout, cwd=cwd)
