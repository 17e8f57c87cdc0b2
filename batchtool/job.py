"""What every run shares: its settings (how to run, never what to compute), its result, and its input opened with
DST checked against it before any pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar


from batchtool import fs
from batchtool.dataset import Dataset, open_dataset
from batchtool.engines import check_engine
from batchtool.output import (OutputOptions, check_destination, refuse_overlap)

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

    def __post_init__(self) -> None:
        check_engine(self.engine, self.ray_address)


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


def open_source(src: str, dst: str, output: OutputOptions, *, tmp_dir: str | None = None,
                format: str | None = None, skip_corrupt: bool = False) -> Dataset:
    """open_dataset for a command that writes DST: before any pass runs or any file is made, refuse a DST
    or tmp dir that overlaps the input, and an existing DST without --overwrite (batchtool.write checks DST
    again before it writes; this is so the user hears it at once)."""
    dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt)
    refuse_overlap(read_paths(dataset), {"DST": dst, "--tmp-dir": tmp_dir})
    check_destination(dst, output.overwrite)
    return dataset
