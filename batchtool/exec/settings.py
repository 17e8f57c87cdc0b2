"""The settings every command and a pipeline file share (how SRC is read, how DST is written, the seed, threads and
memory), declared once as option schemas: the CLI makes its click options from them and a pipeline file's
[input], [output] and top-level keys are read through them, so the two cannot disagree on a name, a default
or a check."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchtool.io.formats import registry
from batchtool.io.formats.declared import CASTS, DEFAULT_SHARD_BYTES
from batchtool.core.errors import OptionError
from batchtool.core.options import Choice, Flag, Integer, Value, option, shown
from batchtool.core.progress import LINE_SECONDS, MODES

if TYPE_CHECKING:
    from batchtool.io.output import OutputOptions
    from batchtool.ops.base import Declaration

BATCH_FORMAT = "arrow"
"""What a command whose output is batches writes without --to: an uncompressed Arrow IPC file, which
batchtool.load memory-maps (one epoch about 6x faster than zstd Parquet, for about twice the disk)."""
ROW_FORMAT = "parquet"
"""What every other command writes without --to: compact, and read by everything."""

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}


def parse_size(text: str | int | None) -> int | None:
    """'256MB', '1GiB', '1000000' (or a number of bytes already) -> bytes; ValueError for anything else."""
    if text is None or isinstance(text, int) and not isinstance(text, bool):
        return text
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size")
    s = text.strip().upper()
    digits = s.rstrip("KMGTIB")
    try:
        return int(float(digits) * _UNITS[s[len(digits):]])
    except (ValueError, KeyError, OverflowError):  # OverflowError: 1e400GB
        raise ValueError(f"{text!r} is not a size") from None


def size_text(size: int) -> str:
    """Bytes as the largest whole unit: 1073741824 -> '1GB' (how --help shows a size's default)."""
    for unit in ("TB", "GB", "MB", "KB"):
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


class Size(Value):
    """A number of bytes: 256MB, 1GiB or 1000000 (a pipeline file may also give an integer). With a minimum, a
    smaller or unreadable size is refused as below it (a limit, rather than a budget)."""

    metavar = "SIZE"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def parse(self, field: str, value: Any) -> int:
        try:
            size = parse_size(value)
        except ValueError:
            size = None
        if size is not None and size >= self.minimum:
            return size
        if self.minimum:
            raise OptionError(field, f"expected a size of at least {self.minimum} byte (e.g. 64MB, 1GB)",
                              value=repr(value))
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise OptionError(field, f"expected a size (e.g. 256MB, 1GB, 1000000), got {shown(value)}")
        raise OptionError(field, f"{value!r} is not a size (e.g. 256MB, 1GB, 1000000)")


class Positive(Integer):
    """A whole number of at least 1."""

    def parse(self, field: str, value: Any) -> int:
        number = super().parse(field, value)
        if number < 1:
            raise OptionError(field, f"{number} must be at least 1")
        return number


class Text(Value):
    """Any string (what it may be is checked where it is used, e.g. a codec by its format)."""

    def parse(self, field: str, value: Any) -> str:
        if not isinstance(value, str):
            raise OptionError(field, f"expected a string, got {shown(value)}")
        return value


class Directory(Text):
    """A directory's path."""

    metavar = "DIRECTORY"


# -- the schemas -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSettings:
    """How SRC is read: a reading command's --format and --skip-corrupt, a pipeline file's [input]."""

    format: str | None = option("Input format (default: from the file names).", Choice(registry.NAMES), None)
    skip_corrupt: bool = option(
        f"Skip damaged {registry.checksummed()} records instead of stopping (a bad CRC; lost framing, up to the "
        "next record whose CRCs check out; a cut-short last record), counting the records and bytes skipped in the "
        "manifest.",
        Flag(), False)


def _codecs() -> str:
    """--compression's help: each written format's codecs, its default first."""
    specs = [registry.declared(name) for name in registry.written()]
    return "; ".join(f"{s.label}: {', '.join(dict.fromkeys((s.default_codec, *s.codecs)))}" for s in specs)


def _narrowed() -> str:
    """Why --cast's formats hold floats as float32 only (Writer.float32_only)."""
    return "; ".join(r for name in registry.written() if (r := registry.declared(name).float32_only))


def _format_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """Every written format's own write options (Writer.write_options), as fields of OutputSettings: declared once,
    in the format's module."""
    specs = [registry.declared(name) for name in registry.written()]
    return [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
            for s in specs if s.write_options is not None for f in dataclasses.fields(s.write_options)]


@dataclass(frozen=True)
class _OutputSettings:
    """How DST is written, as a user sets it: a writing command's --to, --compression, ... and a pipeline file's
    [output] (whose `format` is --to), with each written format's own options after --shard-bytes. `options`
    makes the writer's OutputOptions, which checks the rest."""

    format: str | None = option("Output format.", Choice(registry.written()), None)
    """None: the command's default (default_format)."""
    compression: str | None = option(f"Codec, by format (default first): {_codecs()}.", Text(), None)
    shard_rows: int | None = option("Start a new output shard past this many rows.", Positive(), None)
    shard_bytes: int | None = option(
        f"Start a new output shard past this size (default {size_text(DEFAULT_SHARD_BYTES)}; a compressed stream of "
        "records: their size before compression).", Size(), None)
    index_key: str | None = option(
        "Batch output: the column whose values name the examples in DST's example index (`batchtool where`, "
        "`batchtool step`; default: key, where DST has it, else each example's number in DST).", Text(), None)

    FLAGS = {"format": "--to", "index_key": "--key"}
    """Fields whose command-line flag is not their name's."""

    def options(self, default_format: str) -> OutputOptions:
        """The writer's options, with `default_format` where no format is set."""
        from batchtool.io.output import OutputOptions  # (the writer's module: only once a command runs)

        fmt = self.format or default_format
        spec = registry.get(fmt)
        own = [] if spec.write_options is None else [f.name for f in dataclasses.fields(spec.write_options)]
        return OutputOptions(format=fmt, compression=self.compression, shard_rows=self.shard_rows,
                             shard_bytes=DEFAULT_SHARD_BYTES if self.shard_bytes is None else self.shard_bytes,
                             writing={name: getattr(self, name) for name in own},
                             overwrite=self.overwrite,  # type: ignore[attr-defined]  # (a field of OutputSettings)
                             cast=(self.cast,) if self.cast else (),  # type: ignore[attr-defined]
                             key=self.index_key)


OutputSettings = dataclasses.make_dataclass("OutputSettings", [*_format_fields(), (
    "cast", "str | None", option(f"{registry.narrowing()} output: round float64 columns to float32 ({_narrowed()}; "
                                 "without this they are refused). The manifest lists the columns cast.",
                                 Choice(list(CASTS)), None)), (
    "overwrite", "bool", option("Replace DST if it exists.", Flag(), False))],
    bases=(_OutputSettings,), frozen=True)
OutputSettings.__doc__, OutputSettings.__module__ = _OutputSettings.__doc__, __name__


@dataclass(frozen=True)
class CommonSettings:
    """What a command takes once however many steps it runs, and a pipeline file sets at its top: the seed, the
    threads, the memory and directory of spill files, and how progress shows."""

    seed: int = option("Seed of every random decision (same seed, same output bytes).", Integer(), 0)
    threads: int | None = option("Worker threads; output is identical for any value.", Positive(), None)
    """None: the command line's, else the number of cores."""
    memory: int = option("Memory for reordering: rows within a quarter of it stay in memory (local engine), the "
                         "rest spill to --tmp-dir.", Size(), 1 << 30)
    tmp_dir: str | None = option("Directory for temporary spill files (default: the system's).", Directory(), None)
    progress: str | None = option(
        f"Progress on stderr: a redrawn bar, a line every {LINE_SECONDS:g} s (for logs), or none (default: bar on a terminal, else "
        "lines; none with --quiet).", Choice(MODES), None)


RECORD_LIMIT = Size(minimum=1)
"""--max-record-bytes (a reading command's, applied around the whole command)."""


# -- what DST holds without --to ---------------------------------------------------------------------------------


def default_format(batches: bool | str, given: Callable[[str], Any]) -> str:
    """What DST holds without --to: BATCH_FORMAT when the output is batches, always (True) or when the flag
    `batches` names is set (`given(flag)` is its value), else ROW_FORMAT."""
    return BATCH_FORMAT if batches is True or (batches and given(batches)) else ROW_FORMAT


def batches_of(op: Declaration) -> bool | str:
    """When an op's output is batches: always (an op that makes batches whatever its options), with the flag it
    declares (`batches_flag`), or never."""
    from batchtool.ops.base import Kind  # (the op's module has imported it already)

    return op.batches_flag or op.kind is Kind.BATCHES


def op_default_format(op: Declaration, options: Any) -> str:
    """What an op writes without --to, given its options (a pipeline's last stage)."""
    return default_format(batches_of(op), lambda flag: getattr(options, flag[2:].replace("-", "_")))


__all__ = ["BATCH_FORMAT", "CommonSettings", "Directory", "InputSettings", "OutputSettings", "Positive",
           "RECORD_LIMIT", "ROW_FORMAT", "Size", "Text", "batches_of", "default_format", "op_default_format",
           "parse_size", "size_text"]
