"""Run a command in a child process under a hard RSS cap, so a memory regression fails a test, not the machine.

A watchdog thread reads the child's peak resident set (VmHWM in /proc/<pid>/status) every few
milliseconds and kills it above the cap. Unlike RLIMIT_AS (which breaks pyarrow's allocator, as it
reserves address space it never touches) this bounds what the child really uses. The peak reported is
the child's own VmHWM: written by the child as it exits where it can (`batchtool()` runs it that way),
else the largest the watchdog saw. Not wait4's ru_maxrss: a child started by vfork/exec inherits the
parent's high-water mark, so it would report the pytest process's size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

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


HANG_GUARD = 600.0
"""Seconds a test's child process may run before the test calls it hung: a hang guard only, never a timing
test, so generous that a machine loaded by other work (two whole suites on two cores) does not fail it."""


def run_capped(args: Sequence[str], limit_bytes: int, *, env: dict[str, str] | None = None,
               timeout: float = HANG_GUARD, cwd: str | None = None) -> Capped:
    """Run args to completion, killing the child if its RSS passes limit_bytes or it outlives timeout. The child's
    allocator returns freed memory at once (MIMALLOC_PURGE_DELAY=0, not batchtool's default of 100 ms), so the cap
    judges what batchtool holds, not what the allocator keeps for reuse."""
    killed = threading.Event()
    done = threading.Event()
    seen = [0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".peak") as peak_file:
        child_env = {**(os.environ if env is None else env), "MIMALLOC_PURGE_DELAY": "0",
                     PEAK_FILE_VARIABLE: peak_file.name}
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


def batchtool(*args: str, limit_bytes: int, timeout: float = HANG_GUARD, cwd: str | None = None,
              env: dict[str, str] | None = None) -> Capped:
    """`python -m batchtool ARGS` from this checkout, capped, reporting its exact peak (in os.environ, or env)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.environ if env is None else env
    env = {**base, "PYTHONPATH": repo + os.pathsep + base.get("PYTHONPATH", "")}
    return run_capped([sys.executable, "-c", _PEAK_REPORTER, *map(str, args)], limit_bytes, env=env,
                      timeout=timeout, cwd=cwd)


_CLI_CASES = """
import json, sys
from click.testing import CliRunner
from batchtool.cli import cli
for name, args in json.loads(sys.argv[1]).items():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on: this case's own peak
    with open("/proc/self/status") as status:
        base = int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) << 10
    print(json.dumps({"started": name}), flush=True)
    result = CliRunner().invoke(cli, args)
    crash = None if result.exception is None or isinstance(result.exception, SystemExit) else repr(result.exception)
    with open("/proc/self/status") as status:
        peak = int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) << 10
    print(json.dumps({"name": name, "code": result.exit_code, "stderr": result.stderr, "crash": crash,
                      "peak": peak, "base": base}), flush=True)
"""


@dataclass(frozen=True)
class CliCase:
    """How one command line of cli_cases ended: exit status, stderr, an exception other than an exit (a traceback
    the command line would have shown), and the case's own peak RSS."""

    code: int
    stderr: str
    crash: str | None
    peak_bytes: int
    base_bytes: int
    """What the process held as the case began (what the cases before it left, allocator caches included)."""

    @property
    def grew_bytes(self) -> int:
        """The case's own growth: its peak over what it started with."""
        return self.peak_bytes - self.base_bytes


def cli_cases(cases: Mapping[str, Sequence[str]], limit_bytes: int, timeout: float = HANG_GUARD) -> dict[str, CliCase]:
    """batchtool command lines (name -> argv after `batchtool`) in order in one capped child, each through the
    command line's own group in process: one Python start-up for all of them. Each case's peak RSS is its own (the
    child resets VmHWM before it, /proc/self/clear_refs), counting what the process still holds from the cases before
    (tens of MB more than the case alone in a fresh process). Fails the calling test, naming the case that was running,
    if the child dies (killed above limit_bytes, say)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = run_capped([sys.executable, "-c", _CLI_CASES, json.dumps({k: list(map(str, v)) for k, v in cases.items()})],
                       limit_bytes, env={**os.environ, "PYTHONPATH": repo}, timeout=timeout)
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    if child.returncode != 0:
        started = [line["started"] for line in lines if "started" in line]
        pytest.fail(f"the capped child died (status {child.returncode}, peak {child.peak_mib:.0f} MiB) running "
                    f"{started[-1] if started else 'nothing'}: {child.stderr[-2000:]}")
    return {line["name"]: CliCase(line["code"], line["stderr"], line["crash"], line["peak"], line["base"])
            for line in lines if "name" in line}
