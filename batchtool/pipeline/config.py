"""Pipeline files: TOML read into frozen, validated configs; every error names the file, the stage and the key.

A stage's keys are its command's flags without `--` (`batch-size = 32` is `--batch-size 32`). They
are read by the op's option schema (ops/base.py) when it has a definition, else converted by the click
command's own parameters and turned into options by the function the command uses, so a pipeline stage
and a CLI invocation cannot disagree on a name, a default or a check.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from batchtool import formats, fs
from batchtool.cli import bucket as bucket_cli
from batchtool.cli import pack as pack_cli
from batchtool.cli import segment as segment_cli
from batchtool.cli.common import (cli, default_format, input_options, make_output, output_options, parse_size,
                                  run_options)
from batchtool.errors import BatchtoolError, InputError, UsageError
from batchtool.ops import DEFINED, OPERATIONS
from batchtool.ops.base import ColumnList, Kind, Operation, OptionError, build, fields, required, shown
from batchtool.ops.base import key as key_of
from batchtool.output import OutputOptions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

OPS = tuple(dict.fromkeys(("stratify", "resample", "shuffle", "bucket", "pack", "segment", *OPERATIONS)))
BUILDERS: dict[str, Callable[..., Any]] = {
    "bucket": bucket_cli.bucket_options, "segment": segment_cli.segment_options, "pack": pack_cli.pack_options,
}
"""The function each command builds its options with, from its flags' values."""
SPILLING = ("bucket", "pack")
"""Operations whose options carry the pipeline's memory and tmp-dir (segment gets them when it runs)."""
TOP_KEYS = ("seed", "threads", "memory", "tmp-dir", "input", "stage", "output")
INPUT_KEYS = ("path", "format", "columns", "skip-corrupt")
OUTPUT_KEYS = ("path", "format", "compression", "shard-rows", "shard-bytes", "tfrecord-kind", "overwrite", "cast")
_PIPELINE_WIDE = {"seed": "the top of the file", "threads": "the top of the file", "memory": "the top of the file",
                  "tmp-dir": "the top of the file", "format": "[input] or [output]", "skip-corrupt": "[input]",
                  **{k: "[output]" for k in OUTPUT_KEYS if k not in ("path", "format")}, "to": "[output] as 'format'"}
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
        if self.op in ("bucket", "pack", "segment"):
            return True
        if self.op in OPERATIONS:
            return OPERATIONS[self.op].kind_of(self.options) is Kind.BATCHES
        return self.op in ("stratify", "shuffle") and self.options.batch_size is not None


@dataclass(frozen=True)
class InputConfig:
    path: str
    format: str | None = None
    columns: tuple[str, ...] | None = None
    skip_corrupt: bool = False


@dataclass(frozen=True)
class PipelineConfig:
    """A whole pipeline file, validated; paths are resolved against the file's directory."""

    path: str
    seed: int
    threads: int | None
    memory: int
    tmp_dir: str | None
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
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such pipeline file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipelineError(f"{path}: not a readable TOML file ({exc})") from None
    return _Reader(path).pipeline(doc, tmp_dir, overwrite)


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
                raise self.fail(where, f"unknown key {key!r}{_suggest(key, allowed)}")
        return table

    def pipeline(self, doc: dict[str, Any], tmp_dir: str | None, overwrite: bool) -> PipelineConfig:
        self.keys(doc, TOP_KEYS, None)
        seed = self.scalar(doc, "seed", int, None, 0)
        threads = self.scalar(doc, "threads", int, None, None)
        if threads is not None and threads < 1:
            raise self.fail(None, f"key 'threads': {threads} must be at least 1")
        memory_text = str(self.scalar(doc, "memory", (int, str), None, "1GB"))
        try:
            memory = parse_size(memory_text) or 0
        except click.BadParameter as exc:
            raise self.fail(None, f"key 'memory': {exc.message}") from None
        if tmp_dir is None and doc.get("tmp-dir") is not None:
            tmp_dir = self.resolve(self.scalar(doc, "tmp-dir", str, None, None))
        source = self.input(doc.get("input"))
        if "stage" in doc and not isinstance(doc["stage"], list):
            raise self.fail(None, "key 'stage': write each stage as a [[stage]] table")
        stages = tuple(self.stage(i, table, str(memory), tmp_dir) for i, table in enumerate(doc.get("stage", []), 1))
        self.check_order(stages)
        dst, output = self.output(doc.get("output"), overwrite, stages[-1] if stages else None)
        if not stages:
            raise self.fail(None, "no [[stage]]: a pipeline needs at least one (batchtool convert copies files "
                                  "as they are)")
        return PipelineConfig(self.path, seed, threads, memory, tmp_dir, source, stages, dst, output)

    def scalar(self, table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str | None,
               default: Any) -> Any:
        value = table.get(key, default)
        if value is not default and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
            raise self.fail(where, f"key {key!r}: expected {_kind_name(kind)}, got {shown(value)}")
        return value

    def input(self, table: Any) -> InputConfig:
        if table is None:
            raise self.fail(None, "missing [input] table (with at least path = \"...\")")
        self.keys(table, INPUT_KEYS, "[input]")
        if "path" not in table:
            raise self.fail("[input]", "missing key 'path'")
        fmt = self.scalar(table, "format", str, "[input]", None)
        if fmt is not None and fmt not in formats.FORMATS:
            raise self.fail("[input]", f"key 'format': {fmt!r} is not {', '.join(formats.NAMES)}")
        columns = table.get("columns")
        return InputConfig(self.resolve(self.scalar(table, "path", str, "[input]", None)), fmt,
                           None if columns is None else self.columns(columns),
                           self.scalar(table, "skip-corrupt", bool, "[input]", False))

    def output(self, table: Any, overwrite: bool, last: StageConfig | None) -> tuple[str, OutputOptions]:
        if table is None:
            raise self.fail(None, "missing [output] table (with at least path = \"...\")")
        self.keys(table, OUTPUT_KEYS, "[output]")
        if "path" not in table:
            raise self.fail("[output]", "missing key 'path'")
        dst = self.resolve(self.scalar(table, "path", str, "[output]", None))
        flags = {("--to" if k == "format" else f"--{k}"): v for k, v in table.items() if k != "path"}
        params = _Params(_output_params(), cli.commands["convert"], self, "[output]")
        values = params.values(flags, aliases={"--to": "format"})
        values["overwrite"] = values["overwrite"] or overwrite
        values["output_format"] = values["output_format"] or default_format(  # the last stage's command's --to
            cli.commands.get(last.op) if last else None, lambda flag: last.keys.get(flag[2:]))
        try:
            return dst, make_output(values)
        except (BatchtoolError, click.BadParameter) as exc:
            message = exc.message if isinstance(exc, click.BadParameter) else str(exc)
            raise self.fail("[output]", flags_to_keys(message, {"--to": "format"})) from None

    def columns(self, value: Any) -> tuple[str, ...]:
        """[input] columns: a list of column names (or one comma-separated string)."""
        try:
            return ColumnList().parse("columns", value)
        except OptionError as exc:
            raise self.fail("[input]", exc.rendered("toml")) from None

    def stage(self, index: int, table: Any, memory: str, tmp_dir: str | None) -> StageConfig:
        where = f"stage {index}"
        if not isinstance(table, dict):
            raise self.fail(where, f"expected a [[stage]] table, got {shown(table)}")
        op = table.get("op")
        if op is None:
            raise self.fail(where, f"missing key 'op' (one of: {', '.join(OPS)})")
        if op not in OPS:
            raise self.fail(where, f"key 'op': unknown operation {op!r}{_suggest(str(op), OPS)} "
                                   f"(operations: {', '.join(OPS)})")
        where = f"stage {index} ({op})"
        keys = {k: v for k, v in table.items() if k != "op"}
        for key in keys:
            if key in _PIPELINE_WIDE:
                raise self.fail(where, f"key {key!r} is set for the whole pipeline, in {_PIPELINE_WIDE[key]}")
        options = (self.op_options(DEFINED[op], keys, where, memory, tmp_dir) if op in DEFINED
                   else self.command_options(op, keys, where, memory, tmp_dir))
        return StageConfig(index, op, options, keys)

    def command_options(self, op: str, keys: dict[str, Any], where: str, memory: str, tmp_dir: str | None) -> Any:
        command = cli.commands[op]
        shared = {p.name for p in _shared_params()}
        params = _Params([p for p in command.params if p.name not in shared], command, self, where)
        values = params.values({f"--{k}": v for k, v in keys.items()})
        if op in SPILLING:
            values.update(memory=memory, tmp_dir=tmp_dir)
        try:
            return BUILDERS[op](**values)
        except BatchtoolError as exc:
            raise self.fail(where, flags_to_keys(str(exc))) from None

    def op_options(self, op: Operation, keys: dict[str, Any], where: str, memory: str, tmp_dir: str | None) -> Any:
        """An operation definition's options, from the keys its schema declares (and the pipeline's memory
        and tmp-dir for an op that spills)."""
        declared = {key_of(f.name): f for f, _ in fields(op.options)}
        self.keys(keys, list(declared), where)
        for name, f in declared.items():
            if required(f) and name not in keys:
                raise self.fail(where, f"missing key {name!r}")
        try:
            settings = {"memory": parse_size(memory), "tmp_dir": tmp_dir} if op.spills else {}
            return build(op.options, {declared[k].name: v for k, v in keys.items()}, **settings)
        except OptionError as exc:
            raise self.fail(where, exc.rendered("toml")) from None

    def check_order(self, stages: Sequence[StageConfig]) -> None:
        """A stage that writes batches must be the last: anything after it would regroup its batches."""
        for earlier, later in itertools.pairwise(stages):
            if earlier.batching:
                what = ("writes batches" if earlier.op in ("bucket", "pack", "segment")
                        else "writes batches (batch-size)")
                raise self.fail(later.name, f"key 'op': cannot follow {earlier.name}, which {what} that a later "
                                            "stage would break up; a batching stage (bucket, pack, segment, "
                                            "stratify or shuffle with batch-size) must be the last stage")


class _Params:
    """A click command's options, looked up by their long flag and converted with their own types."""

    def __init__(self, params: Sequence[click.Parameter], command: click.Command, reader: _Reader,
                 where: str) -> None:
        self.reader, self.where = reader, where
        self.ctx = click.Context(command)
        self.options = {opt: p for p in params if isinstance(p, click.Option)
                        for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}

    def values(self, flags: dict[str, Any], aliases: Mapping[str, str] | None = None) -> dict[str, Any]:
        """{python name: value} for every option of the command: the given ones converted, the rest defaults."""
        aliases = aliases or {}
        key_of = {flag: aliases.get(flag, flag[2:]) for flag in self.options}
        for flag in flags:
            if flag not in self.options:
                key = aliases.get(flag, flag[2:])
                raise self.reader.fail(self.where, f"unknown key {key!r}{_suggest(key, sorted(key_of.values()))}")
        values: dict[str, Any] = {}
        for param in dict.fromkeys(self.options.values()):
            given = [flag for flag in (*param.opts, *param.secondary_opts) if flag in flags]
            if len(given) > 1:
                raise self.reader.fail(self.where, f"keys {' and '.join(repr(key_of[g]) for g in given)} "
                                                   "set the same option; give one")
            if given:
                flag = given[0]
                values[param.name] = self.convert(param, flags[flag], key_of[flag], flag in param.secondary_opts)
            elif param.required:
                raise self.reader.fail(self.where, f"missing key {key_of[param.opts[0]]!r}")
            else:
                default = param.get_default(self.ctx)
                values[param.name] = () if param.multiple else default if _is_value(default) else None
        return values

    def convert(self, param: click.Option, value: Any, key: str, secondary: bool) -> Any:
        """A TOML value through the option's own type; flags take true/false."""
        if param.is_flag:
            if not isinstance(value, bool):
                raise self.reader.fail(self.where, f"key {key!r}: expected true or false, got {shown(value)}")
            return value != secondary
        if param.multiple:
            items = [f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else \
                value if isinstance(value, list) else [value]
            converted = tuple(self.scalar(param, item, key) for item in items)
            if param.callback is None:  # a column list's callback splits and checks as on the command line
                return converted
            try:
                return param.callback(self.ctx, param, converted)
            except click.BadParameter as exc:
                raise self.reader.fail(self.where, f"key {key!r}: {exc.message}") from None
        return self.scalar(param, value, key)

    def scalar(self, param: click.Option, value: Any, key: str) -> Any:
        kind = param.type
        if isinstance(kind, click.types.StringParamType | click.Path):
            if isinstance(value, dict):  # CLASS=PROB or COL=VALUE pairs
                value = ",".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, list) and all(_is_scalar(v) for v in value):  # comma-separated values
                value = ",".join(str(v) for v in value)
            elif _is_scalar(value):
                value = str(value)
        expected = _toml_kind(kind)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise self.reader.fail(self.where, f"key {key!r}: expected {_kind_name(expected)}, got {shown(value)}")
        try:
            return kind.convert(value, param, self.ctx)
        except click.BadParameter as exc:
            raise self.reader.fail(self.where, f"key {key!r}: {exc.message}") from None


def _shared_params() -> list[click.Parameter]:
    """The options every command shares (input, output, run): set once for the pipeline, not per stage."""
    probe = run_options(output_options(input_options(lambda **kwargs: None)))
    pipeline_wide = [click.Option(["--seed"]), click.Option(["--memory"]), click.Option(["--tmp-dir"])]
    return [*probe.__click_params__, *pipeline_wide]  # type: ignore[attr-defined]


def _output_params() -> list[click.Parameter]:
    return output_options(lambda **kwargs: None).__click_params__  # type: ignore[attr-defined]


def _toml_kind(kind: click.ParamType) -> type | tuple[type, ...]:
    if isinstance(kind, click.types.IntParamType):
        return int
    if isinstance(kind, click.types.FloatParamType):
        return (int, float)
    return str


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return names[float] if float in kinds else " or ".join(names[k] for k in kinds)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _is_value(default: Any) -> bool:
    """click marks 'no default' with a sentinel object; anything else is a real default."""
    return default is None or isinstance(default, (str, int, float, bool, tuple, list))


def _suggest(key: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (keys: {', '.join(allowed)})"


def flags_to_keys(message: str, aliases: Mapping[str, str] | None = None) -> str:
    """Options report problems by flag (--batch-size); a pipeline file says batch-size."""
    aliases = aliases or {}
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: aliases.get(m.group(0), m.group(1)), message)


__all__ = ["OPS", "InputConfig", "PipelineConfig", "PipelineError", "StageConfig", "load"]
