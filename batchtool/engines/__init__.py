"""Execution engines: which one runs the per-item functions of a command, chosen by RunSettings.engine.

"One algorithm, several engines": an engine decides where `fn(item)` runs, never what it computes.
Every operation reaches its workers through `runner.ordered_map`; the engine is chosen in one place,
`with_engine` on each entry point that takes a RunSettings (run_operation, convert, check, inspect,
run_pipeline), whose `engine_scope(run)` makes the run's engine the one behind those calls for the
duration of the call. `local` (the default) is the thread runner in batchtool.runner; `ray` (the
optional extra) is batchtool.engines.ray.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from batchtool import runner
from batchtool.errors import UsageError

ENGINES = ("local", "ray")
NEEDS_RAY = "--engine ray needs the ray extra: pip install 'batchtool[ray]'"

F = TypeVar("F", bound=Callable)
_finalize = True
"""False once an engine's runtime died under the program (see skip_finalizing)."""


class EngineSettings(Protocol):
    """What choosing an engine needs from RunSettings."""

    engine: str
    ray_address: str | None
    threads: int


def check_engine(engine: str, ray_address: str | None) -> None:
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if ray_address is not None and engine != "ray":
        raise UsageError(f"--ray-address {ray_address}: needs --engine ray")


@contextlib.contextmanager
def engine_scope(run: EngineSettings) -> Iterator[None]:
    """Make run.engine the engine of every ordered_map call in the block.

    A block inside another of the same engine reuses it (one Ray connection per command, however
    many stages call in); an engine this block started is shut down when it ends.
    """
    check_engine(run.engine, run.ray_address)
    active = runner.active_engine()
    if run.engine == "local":
        with runner.use_engine(None):
            yield
        return
    if active is not None and active.name == run.engine:
        yield
        return
    from batchtool.engines.ray import RayEngine

    engine = RayEngine(run.ray_address, local_cpus=run.threads)
    try:
        with runner.use_engine(engine):
            yield
    finally:
        engine.close()


def engine_summary() -> dict[str, object]:
    """What the active engine reports about the command so far (for the manifest's `run`): nothing
    for the local engine; {"ray": timings} for Ray."""
    engine = runner.active_engine()
    report = getattr(engine, "timings", None)
    return {engine.name: report.summary()} if report is not None else {}


def skip_finalizing() -> None:
    """Said by an engine whose runtime died under the program (Ray: the raylet of the driver's node): tearing it down
    as the interpreter exits may crash, or end the process with Ray's status, so the program ends without finalizing
    once its command is over (batchtool.entry does, after the error line)."""
    global _finalize
    _finalize = False


def finalizing_skipped() -> bool:
    return not _finalize


def with_engine(fn: F) -> F:
    """Decorate an entry point (which takes `run: RunSettings`) to run on run.engine: the library and the CLI
    (whose run_options only make the RunSettings) choose the engine here and nowhere else."""
    signature = inspect.signature(fn)
    default = signature.parameters["run"].default

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        run = signature.bind_partial(*args, **kwargs).arguments.get("run", default)
        with engine_scope(run):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["ENGINES", "NEEDS_RAY", "check_engine", "engine_scope", "engine_summary", "finalizing_skipped",
           "skip_finalizing", "with_engine"]
