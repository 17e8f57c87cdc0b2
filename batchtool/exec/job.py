"""What every run shares: its result, and its input opened with DST checked against it before any pass, under the
run's settings (batchtool.core.run_settings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchtool.core import fs
from batchtool.io.dataset import Dataset
from batchtool.core.errors import InputError, OptionError
from batchtool.io.inputs import open_dataset
from batchtool.io.mixed import SOURCE, MixedDataset, mix_datasets
from batchtool.ops.names import refuse_clashes
from batchtool.ops.written import batched_rows
from batchtool.io.output import OutputOptions, check_destination, refuse_overlap
from batchtool.core.run_settings import RunSettings
from batchtool.core.runner import Executor

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
