"""Where the tasks of a run write what later tasks read (map outputs, sorted key ranges, spooled batches, segment's
rows and key hashes): one directory per run, on storage every worker of the engine shares, removed however the run
ends."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass

from batchtool.core import fs
from batchtool.core.runner import Executor, Threads
from batchtool.io.spill import make_temporary_dir, temporary_write_errors

WORKSPACE = ".exchange"
"""The exchange's directory in DST's temporary directory: beside DST, so on the storage the workers write the
output to, and never left behind (see workspace)."""


@dataclass(frozen=True)
class Workspace:
    """Where an exchange's tasks write (map outputs, sorted ranges, spooled batches), and what a refused write
    there names."""

    directory: str
    name: str
    """DST (or a pipeline's output), for errors."""
    tmp_dir: str | None = None
    """--tmp-dir, when the workspace is there."""
    shared: bool = False
    """Beside DST, on the storage the workers of an engine that does not share the driver's disk write DST to;
    False: the driver's own disk."""

    def errors(self) -> AbstractContextManager[None]:
        """A refused write in the workspace as one error naming where it is (--tmp-dir, DST, or the system's
        temporary directory)."""
        if self.shared:
            return fs.write_errors(f"{self.name}: cannot write the output")
        return temporary_write_errors(self.tmp_dir)


@contextmanager
def workspace(dst: str, executor: Executor, tmp_dir: str | None = None,
              inside: str | None = None) -> Iterator[Workspace]:
    """The workspace of an exchange writing `dst`, removed when the block ends: beside DST (in DST's temporary
    directory `inside` if it exists yet, else in a `.DST.tmp-*` of its own) when the executor's workers do not see
    the driver's disk (runner.Shares.disk) and DST is a path whose parent exists, so every worker shares it; else in
    --tmp-dir `tmp_dir`, or the system's temporary directory.

    Its directory is renamed before it is removed: every task creates its files and directories by paths under
    the old name (and with mkdir, never makedirs), so a task still running after a failure (the local engine
    does not wait for its threads; a Ray task runs until its job ends) can no longer add anything while the
    tree is being removed.
    """
    dst_path = None if fs.is_uri(dst) else os.path.abspath(dst)
    shared = (not executor.shares.disk and dst_path is not None
              and (inside is not None or os.path.isdir(os.path.dirname(dst_path))))
    own = None
    if not shared:
        own = make_temporary_dir("batchtool-exchange-", tmp_dir)
    elif inside is None:
        with fs.write_errors(f"{dst_path}: cannot write beside the output"):
            own = fs.make_unique_dir(os.path.dirname(dst_path), f".{os.path.basename(dst_path)}.tmp-")
    space = Workspace(os.path.join(own or inside, WORKSPACE), dst, None if shared else tmp_dir, shared)
    try:
        with space.errors():
            os.mkdir(space.directory)
        yield space
    finally:
        removed = space.directory + "-removed"
        with suppress(OSError):
            os.rename(space.directory, removed)
        fs.remove_tree(removed)
        fs.remove_tree(space.directory)
        if own is not None:
            fs.remove_tree(own)


def tasks_executor(space: Workspace, executor: Executor) -> Executor:
    """What runs the tasks that write the workspace: the run's executor if its workers reach the workspace (beside
    DST, or on the driver's disk they share), else the driver's threads."""
    return executor if space.shared or executor.shares.disk else Threads(executor.threads)


__all__ = ["WORKSPACE", "Workspace", "tasks_executor", "workspace"]
