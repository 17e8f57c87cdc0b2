"""Pipeline files: TOML read into frozen, validated configs; every error names the file, the stage and the key.

A stage's keys are its command's flags without `--` (`batch-size = 32` is `--batch-size 32`), read by the
op's declared option schema (ops/base.py's Declaration: reading a file imports no op's kernels); [input], [output] and the top-level keys are read by the schemas of the
settings every command shares (batchtool.exec.settings). The command line's options are generated from the same
schemas, so a pipeline file and a command cannot disagree on a name, a default or a check.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchtool.core import fs
from batchtool.core.errors import UsageError
from batchtool.io.mixed import source_names
from batchtool.ops import DECLARATIONS
from batchtool.ops.base import Kind, OptionError
from batchtool.core.options import ColumnList, TableError, fields, option, read_table, shown, suggest
from batchtool.core.errors import key as key_of
from batchtool.io.output import OutputOptions
from batchtool.exec.settings import ROW_FORMAT, CommonSettings, InputSettings, OutputSettings, Text, op_default_format
from batchtool.core.tomlfile import read_toml

OPS = tuple(DECLARATIONS)
TABLES = ("input", "stage", "output")


def _keys(schema: type) -> list[str]:
    return [key_of(f.name) for f, _ in fields(schema)]


TOP_KEYS = (*_keys(CommonSettings), *TABLES)
_PIPELINE_WIDE = {**{k: "the top of the file" for k in _keys(CommonSettings)},
                  **{k: "[input]" for k in _keys(InputSettings)}, **{k: "[output]" for k in _keys(OutputSettings)},
                  "format": "[input] or [output]", "to": "[output] as 'format'"}
"""Keys a stage may not set, and where they go instead."""


@dataclass(frozen=True)
class StageConfig:
    """One `[[stage]]` table: its 1-based position, operation, options, and the keys as written."""

    index: int
    op: str
    options: Any
    keys: Mapping[str, Any]

    @property
    def name(self) -> str:
        return f"stage {self.index} ({self.op})"

    @property
    def batching(self) -> bool:
        """Does it write batches (row groups a later stage would regroup)? Then it must be last."""
        return DECLARATIONS[self.op].writes_batches(self.options)


class InputPaths(Text):
    """[input] path: one input (a string), or the sources a pipeline mixes (a list of at least two)."""

    def parse(self, field: str, value: Any) -> str | tuple[str, ...]:
        if not isinstance(value, list):
            return super().parse(field, value)
        if len(value) < 2 or not all(isinstance(v, str) and v for v in value):
            raise OptionError(field, "expected a path, or a list of at least two paths (the sources of a mix), got "
                              f"{shown(value)}")
        return tuple(value)


@dataclass(frozen=True, kw_only=True)
class InputConfig(InputSettings):
    """[input]: what a command's SRC, --columns, --format and --skip-corrupt say (the path resolved)."""

    path: str | tuple[str, ...] = option(
        "The input: a file, a directory or a glob; or a list of such inputs, the sources of a mix (the first stage is "
        "op = \"mix\").", InputPaths())
    columns: tuple[str, ...] | None = option("Columns to read, in this order (default: all).", ColumnList(), None)

    @property
    def sources(self) -> tuple[str, ...] | None:
        """The sources of a mix (path as a list); None for one input."""
        return self.path if isinstance(self.path, tuple) else None


@dataclass(frozen=True, kw_only=True)
class OutputConfig(OutputSettings):
    """[output]: what a command's DST and output options say."""

    path: str = option("The output directory.", Text())


@dataclass(frozen=True)
class PipelineConfig:
    """A whole pipeline file, validated; paths are resolved against the file's directory."""

    path: str
    seed: int
    threads: int | None
    memory: int
    tmp_dir: str | None
    progress: str | None
    """The file's `progress` (the command line's --progress and --quiet win)."""
    input: InputConfig
    stages: tuple[StageConfig, ...]
    output_path: str
    output: OutputOptions

    def manifest_options(self) -> dict[str, Any]:
        """What the manifest records: the file and every setting as written, paths resolved."""
        return {"pipeline": os.path.abspath(self.path), "seed": self.seed, "memory": self.memory,
                "input": {"path": self.input.path, "format": self.input.format,
                          "columns": list(self.input.columns) if self.input.columns else None},
                "stages": [{"op": s.op, **s.keys} for s in self.stages],
                "output": {"path": self.output_path, "format": self.output.format, "compression": self.output.codec,
                           "shard_rows": self.output.shard_rows, "shard_bytes": self.output.shard_bytes}}


class PipelineError(UsageError):
    """A pipeline file that cannot run as written."""


def load(path: str, *, tmp_dir: str | None = None, overwrite: bool = False) -> PipelineConfig:
    """Read and validate a pipeline file; `tmp_dir` and `overwrite` (from the command line) override the file."""
    return _Reader(path).pipeline(read_toml(path, "pipeline file"), tmp_dir, overwrite)


class _Reader:
    """Validation with the file's name and directory at hand, for messages and relative paths."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.base = os.path.dirname(os.path.abspath(path))

    def fail(self, where: str | None, message: str) -> PipelineError:
        return PipelineError(f"{self.path}: {where + ': ' if where else ''}{message}")

    def resolve(self, path: str) -> str:
        return path if fs.is_uri(path) or os.path.isabs(path) else os.path.join(self.base, path)

    def keys(self, table: Any, allowed: Sequence[str], where: str | None, what: str = "table") -> dict[str, Any]:
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a {what}, got {shown(table)}")
        for key in table:
            if key not in allowed:
                raise self.fail(where, f"unknown key {key!r}{suggest(key, allowed)}")
        return table

    def pipeline(self, doc: dict[str, Any], tmp_dir: str | None, overwrite: bool) -> PipelineConfig:
        self.keys(doc, TOP_KEYS, None)
        common = self.table(CommonSettings, {k: v for k, v in doc.items() if k not in TABLES}, None)
        if tmp_dir is None and common.tmp_dir is not None:
            tmp_dir = self.resolve(common.tmp_dir)
        source = self.input(doc.get("input"))
        if "stage" in doc and not isinstance(doc["stage"], list):
            raise self.fail(None, "key 'stage': write each stage as a [[stage]] table")
        stages = tuple(self.stage(i, table, source.sources) for i, table in enumerate(doc.get("stage", []), 1))
        self.check_order(stages)
        self.check_mix(source, stages)
        dst, output = self.output(doc.get("output"), overwrite, stages[-1] if stages else None)
        if not stages:
            raise self.fail(None, "no [[stage]]: a pipeline needs at least one (batchtool convert copies files "
                                  "as they are)")
        return PipelineConfig(self.path, common.seed, common.threads, common.memory, tmp_dir, common.progress, source,
                              stages, dst, output)

    def table(self, schema: type, table: Any, where: str | None, **settings: Any) -> Any:
        """A table read through an option schema (batchtool.core.options.read_table); `settings` are fields the file does not set."""
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a table, got {shown(table)}")
        try:
            return read_table(schema, table, **settings)
        except TableError as exc:
            raise self.fail(where, str(exc)) from None
        except OptionError as exc:
            raise self.fail(where, exc.rendered("toml")) from None

    def input(self, table: Any) -> InputConfig:
        if table is None:
            raise self.fail(None, "missing [input] table (with at least path = \"...\")")
        source = self.table(InputConfig, table, "[input]")
        if source.sources is not None:
            return replace(source, path=tuple(self.resolve(path) for path in source.sources))
        return replace(source, path=self.resolve(source.path))

    def output(self, table: Any, overwrite: bool, last: StageConfig | None) -> tuple[str, OutputOptions]:
        """[output]: where, and the writer's options (in the format the last stage's command writes by default)."""
        if table is None:
            raise self.fail(None, "missing [output] table (with at least path = \"...\")")
        settings = self.table(OutputConfig, table, "[output]")
        try:
            output = replace(settings, overwrite=settings.overwrite or overwrite).options(_default_format(last))
        except OptionError as exc:
            raise self.fail("[output]", exc.rendered("toml")) from None
        return self.resolve(settings.path), output

    def stage(self, index: int, table: Any, sources: tuple[str, ...] | None) -> StageConfig:
        """A [[stage]] read by its op's option schema; a mix's sources are named after [input] path's, unless it
        names them."""
        where = f"stage {index}"
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a [[stage]] table, got {shown(table)}")
        op = table.get("op")
        if op is None:
            raise self.fail(where, f"missing key 'op' (one of: {', '.join(OPS)})")
        if op not in OPS:
            raise self.fail(where, f"key 'op': unknown operation {op!r}{suggest(str(op), OPS)} "
                                   f"(operations: {', '.join(OPS)})")
        where = f"stage {index} ({op})"
        keys = {k: v for k, v in table.items() if k != "op"}
        for key in keys:
            if key in _PIPELINE_WIDE:
                raise self.fail(where, f"key {key!r} is set for the whole pipeline, in {_PIPELINE_WIDE[key]}")
        several = DECLARATIONS[op].several_sources
        if several and (index != 1 or sources is None):
            raise self.fail(where, f"key 'op': {op} mixes the sources [input] path lists: make it the first stage, "
                                   "with path = [\"SRC\", \"SRC\", ...]")
        named = {"names": source_names(sources)} if several and sources is not None and "names" not in keys else {}
        options = self.table(DECLARATIONS[op].options, keys, where, **named)
        if several and getattr(options, "schedule", None) is not None:  # a mix's schedule file: beside this one
            options = replace(options, schedule=self.resolve(options.schedule))
        if several and sources is not None and len(options.names) != len(sources):
            raise self.fail(where, f"key 'names': {len(options.names)} names for the {len(sources)} sources of "
                                   "[input] path")
        return StageConfig(index, op, options, keys)

    def check_order(self, stages: Sequence[StageConfig]) -> None:
        """A stage that writes batches must be the last: anything after it would regroup its batches."""
        for earlier, later in itertools.pairwise(stages):
            if earlier.batching:
                what = ("writes batches" if DECLARATIONS[earlier.op].kind is Kind.BATCHES
                        else "writes batches (batch-size)")
                raise self.fail(later.name, f"key 'op': cannot follow {earlier.name}, which {what} that a later "
                                            "stage would break up; a batching stage (bucket, pack, segment, "
                                            "stratify, shuffle or mix with batch-size) must be the last stage")

    def check_mix(self, source: InputConfig, stages: Sequence[StageConfig]) -> None:
        """Several inputs are a mix's sources: its stage comes first (stage() keeps it there)."""
        if source.sources is not None and (not stages or not DECLARATIONS[stages[0].op].several_sources):
            raise self.fail("[input]", f"key 'path': {len(source.sources)} sources are mixed by a first stage "
                                       "op = \"mix\" (with weights, temperature or schedule)")


def _default_format(last: StageConfig | None) -> str:
    """What the pipeline writes without [output] format: what its last stage's command writes without --to."""
    if last is None:  # no stage: an error follows
        return ROW_FORMAT
    return op_default_format(DECLARATIONS[last.op], last.options)


__all__ = ["OPS", "InputConfig", "PipelineConfig", "PipelineError", "StageConfig", "load"]
