"""How a run runs, never what it computes: its settings (threads, engine, memory, temporary directory), declared at
the bottom so that every layer that runs or plans work can take them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES, DEFAULT_MEMORY, check_record_limit
from batchtool.core.errors import OptionError, UsageError
from batchtool.core.progress import LINE_SECONDS, MODES, Shown

ENGINES = {
    "local": "batchtool.core.runner:Threads",
    "processes": "batchtool.exec.engines.processes:ProcessEngine",
    "ray": "batchtool.exec.engines.ray:RayEngine",
}
"""Where a run's per-item work runs: each --engine value and its executor class, as module:class, imported only when
chosen (batchtool.exec.engines.start). Adding an engine is its class and a line here."""


def check_engine(engine: str, ray_address: str | None) -> None:
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if ray_address is not None and engine != "ray":
        raise UsageError(f"--ray-address {ray_address}: needs --engine ray")


@dataclass(frozen=True)
class RunSettings:
    """How to run, never what to compute: none of these may change output bytes."""

    threads: int = 1
    quiet: bool = False
    """--quiet: no summary, and no progress unless `progress` says otherwise."""
    progress: str | None = None
    """--progress: one of progress.MODES; None: a bar on a terminal, lines elsewhere (or none with `quiet`)."""
    progress_seconds: float = LINE_SECONDS
    """The seconds between two progress lines."""
    engine: str = "local"
    """Where per-item work runs: "local" threads, "processes" on this machine, or "ray" (one of ENGINES)."""
    ray_address: str | None = None
    """An existing Ray cluster to connect to; None starts a local one with `threads` CPUs."""
    memory: int | None = None
    """--memory: what the run may hold at once (spills, batches, and what one unit of its input decompresses
    to); None: a command without --memory, whose input obeys `max_record_bytes` and whose ops the default."""
    tmp_dir: str | None = None
    """--tmp-dir: where the local engine's workspace is (None: the system's temporary directory)."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """--max-record-bytes: the largest input record read (and, without `memory`, Arrow IPC record batch)."""

    def __post_init__(self) -> None:
        check_engine(self.engine, self.ray_address)
        if self.progress not in (None, *MODES):
            raise OptionError("progress", f"expected one of {', '.join(MODES)}", value=repr(self.progress))
        if not 0 < self.progress_seconds < math.inf:
            raise OptionError("progress_seconds", "must be a number of seconds above 0",
                              value=repr(self.progress_seconds))
        if self.memory is not None and self.memory <= 0:
            raise OptionError("memory", "must be a positive size", value=str(self.memory))
        check_record_limit(self.max_record_bytes)

    @property
    def shown(self) -> Shown:
        """How the run's passes show their progress."""
        return Shown(self.progress or ("none" if self.quiet else None), self.progress_seconds)

    @property
    def budget(self) -> int:
        """The memory the run's ops plan under: --memory, or its default."""
        return DEFAULT_MEMORY if self.memory is None else self.memory

    def recorded(self, names: tuple[str, ...]) -> dict[str, Any]:
        """These settings as a manifest's options record them (an op that spills: Operation.spills)."""
        return {name: {"memory": self.budget, "tmp_dir": self.tmp_dir}[name] for name in names}


__all__ = ["ENGINES", "RunSettings", "check_engine"]
