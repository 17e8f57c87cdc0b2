"""What every run shares: its settings (how to run, never what to compute), its result, and its input opened with
DST checked against it before any pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from batchtool import fs
from batchtool.budget import DEFAULT_MAX_RECORD_BYTES, DEFAULT_MEMORY, check_record_limit
from batchtool.dataset import Dataset
from batchtool.engines import check_engine
from batchtool.errors import OptionError
from batchtool.inputs import open_dataset
from batchtool.output import OutputOptions, check_destination, refuse_overlap
from batchtool.runner import Executor

X = TypeVar("X")


@dataclass(frozen=True)
class RunSettings:
    """How to run, never what to compute: none of these may change output bytes."""

    threads: int = 1
    quiet: bool = False
    engine: str = "local"
    """Where per-item work runs: "local" threads or "ray" (see batchtool.engines)."""
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
        if self.memory is not None and self.memory <= 0:
            raise OptionError("memory", "must be a positive size", value=str(self.memory))
        check_record_limit(self.max_record_bytes)

    @property
    def budget(self) -> int:
        """The memory the run's ops plan under: --memory, or its default."""
        return DEFAULT_MEMORY if self.memory is None else self.memory

    def recorded(self, names: tuple[str, ...]) -> dict[str, Any]:
        """These settings as a manifest's options record them (an op that spills: Operation.spills)."""
        return {name: {"memory": self.budget, "tmp_dir": self.tmp_dir}[name] for name in names}


@dataclass
class JobResult:
    manifest: dict[str, Any]
    rows_in: int
    rows_out: int
    extra: dict[str, Any] = field(default_factory=dict)


def read_paths(dataset: Dataset) -> list[str]:
    """Every place a command reads: each shard, SRC when it is a directory, and the directory a glob
    lists when it reaches into subdirectories (what refuse_overlap keeps DST and the tmp dir out of)."""
    src = dataset.src
    root = fs.glob_root(src) if fs.is_glob(src) else src if fs.is_dir(src) else None
    return ([root] if root is not None else []) + [s.path for s in dataset.shards]


def open_source(src: str, dst: str, output: OutputOptions, run: RunSettings, executor: Executor, *,
                format: str | None = None, skip_corrupt: bool = False) -> Dataset:
    """open_dataset for a command that writes DST, under the run's limits: before any pass runs or any file is made,
    refuse a DST or tmp dir that overlaps the input, and an existing DST without --overwrite (batchtool.write checks
    DST again before it writes; this is so the user hears it at once)."""
    dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt, max_record_bytes=run.max_record_bytes,
                           memory=run.memory, executor=executor)
    refuse_overlap(read_paths(dataset), {"DST": dst, "--tmp-dir": run.tmp_dir})
    check_destination(dst, output.overwrite)
    return dataset
