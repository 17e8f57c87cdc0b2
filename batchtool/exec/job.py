"""What every run shares: its settings (how to run, never what to compute), its result, and its input opened with
DST checked against it before any pass."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from batchtool.core import fs
from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES, DEFAULT_MEMORY, check_record_limit
from batchtool.io.dataset import Dataset
from batchtool.exec.engines import check_engine
from batchtool.core.errors import InputError, OptionError
from batchtool.io.inputs import open_dataset
from batchtool.io.mixed import SOURCE, MixedDataset, mix_datasets
from batchtool.ops.names import refuse_clashes
from batchtool.ops.written import batched_rows
from batchtool.io.output import OutputOptions, check_destination, refuse_overlap
from batchtool.core.progress import LINE_SECONDS, MODES, Shown
from batchtool.core.runner import Executor

X = TypeVar("X")


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
    """Where per-item work runs: "local" threads or "ray" (see batchtool.exec.engines)."""
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


@dataclass
class JobResult:
    manifest: dict[str, Any]
    rows_in: int
    rows_out: int
    extra: dict[str, Any] = field(default_factory=dict)


def read_paths(dataset: Dataset) -> list[str]:
    """Every place a command reads: each shard, SRC when it is a directory, and the directory a glob
    lists when it reaches into subdirectories (what refuse_overlap keeps DST and the tmp dir out of); for a mix,
    each of its sources'."""
    paths = []
    for part in dataset.parts():
        src = part.dataset.src
        root = fs.glob_root(src) if fs.is_glob(src) else src if fs.is_dir(src) else None
        paths += ([root] if root is not None else []) + [s.path for s in part.dataset.shards]
    return paths


def open_source(src: str, dst: str, output: OutputOptions, run: RunSettings, executor: Executor, *,
                format: str | None = None, skip_corrupt: bool = False) -> Dataset:
    """open_dataset for a command that writes DST, under the run's limits: before any pass runs or any file is made,
    refuse a DST or tmp dir that overlaps the input, and an existing DST without --overwrite (batchtool.exec.write checks
    DST again before it writes; this is so the user hears it at once)."""
    dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt, max_record_bytes=run.max_record_bytes,
                           memory=run.memory, executor=executor)
    refuse_overlap(read_paths(dataset), {"DST": dst, "--tmp-dir": run.tmp_dir})
    check_destination(dst, output.overwrite)
    return dataset


def open_mixed(srcs: Sequence[str], names: Sequence[str], column: str, run: RunSettings, executor: Executor, *,
               format: str | None = None, skip_corrupt: bool = False, columns: Sequence[str] | None = None,
               op: str = "mix") -> MixedDataset:
    """Several SRCs as one dataset (batchtool.io.mixed) under the run's limits, each opened as a SRC is: none a batchtool
    output of padded batches (its rows are not the examples), none keeping a column named as the source column
    (`op`'s own, which --output-column renames)."""
    datasets = [open_dataset(src, format=format, skip_corrupt=skip_corrupt, max_record_bytes=run.max_record_bytes,
                             memory=run.memory, executor=executor) for src in srcs]
    for src, dataset in zip(srcs, datasets):
        made_by = batched_rows(dataset.manifest, src)
        if made_by is not None:
            raise InputError(f"{src}: an output of batchtool {made_by}, whose rows are padded, packed or segmented "
                             "batches rather than examples; mix the data it was made from")
        try:
            refuse_clashes(op, {SOURCE: column}, dataset.schema.names if columns is None else columns)
        except OptionError as exc:
            raise exc.at(src) from None
    return mix_datasets(datasets, names, column, columns)


def open_sources(srcs: Sequence[str], names: Sequence[str], column: str, dst: str, output: OutputOptions,
                 run: RunSettings, executor: Executor, *, format: str | None = None, skip_corrupt: bool = False,
                 columns: Sequence[str] | None = None) -> MixedDataset:
    """open_mixed for a command that writes DST, checked against DST and the tmp dir as open_source checks one SRC."""
    dataset = open_mixed(srcs, names, column, run, executor, format=format, skip_corrupt=skip_corrupt,
                         columns=columns)
    refuse_overlap(read_paths(dataset), {"DST": dst, "--tmp-dir": run.tmp_dir})
    check_destination(dst, output.overwrite)
    return dataset
