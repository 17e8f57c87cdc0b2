"""Execution engines: where a run's per-item functions run, chosen once per run from RunSettings.engine.

"One algorithm, several engines": an engine decides where `fn(item)` runs, never what it computes. Each entry point
that takes a RunSettings (run_operation, convert, check, inspect, run_pipeline) opens the run's executor with
`executor(run)` and passes it to whatever maps work over items. `local` (the default) is runner.Threads; `ray`
(the optional extra) is batchtool.exec.engines.ray.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor, Threads

if TYPE_CHECKING:
    from batchtool.exec.engines.ray import RayEngine


@contextmanager
def executor(run: RunSettings) -> Iterator[Executor]:
    """The run's executor while the block runs: its threads, or a Ray connection (started lazily, at its first
    map) that is closed when the block ends."""
    if run.engine == "local":
        yield Threads(run.threads)
        return
    remote = start_ray(run)
    try:
        yield remote
    finally:
        remote.close()


def start_ray(run: RunSettings) -> RayEngine:
    """The Ray executor of a run (--ray-address, or a local cluster of --threads CPUs)."""
    from batchtool.exec.engines.ray import RayEngine

    return RayEngine(run.ray_address, local_cpus=run.threads)


__all__ = ["executor", "start_ray"]
