"""Execution engines: where a run's per-item functions run, chosen once per run from RunSettings.engine.

"One algorithm, several engines": an engine decides where `fn(item)` runs, never what it computes. Each entry point
that takes a RunSettings (run_operation, convert, check, inspect, run_pipeline) opens the run's executor with
`executor(run)` and passes it to whatever maps work over items. The engines are core.run_settings.ENGINES: `local`
(the default, runner.Threads), `processes` (engines/processes.py, a pool of local processes) and `ray` (the
optional extra, engines/ray.py); an engine's module is imported only when a run chooses it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from batchtool.core.run_settings import ENGINES, RunSettings
from batchtool.core.runner import Executor


def start(run: RunSettings) -> Executor:
    """The executor of the run's --engine, its class imported now (ENGINES names it); it starts nothing costly
    before its first map."""
    module, _, name = ENGINES[run.engine].partition(":")
    return getattr(importlib.import_module(module), name).start(run)


@contextmanager
def executor(run: RunSettings) -> Iterator[Executor]:
    """The run's executor while the block runs, closed when the block ends (its workers, or its Ray connection)."""
    opened = start(run)
    try:
        yield opened
    finally:
        opened.close()


__all__ = ["executor", "start"]
