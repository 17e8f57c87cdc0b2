"""The one exception hierarchy: every failure a user can cause is a BatchtoolError."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


class BatchtoolError(Exception):
    """A failure the user can fix; the CLI prints it as one line and exits 2."""

    exit_code = 2

    def rendered(self, vocabulary: str) -> str:
        """The message as a front end ("cli" or "toml") shows it: the same words, unless it names options
        (NamesOptions)."""
        return str(self)


class UsageError(BatchtoolError):
    """Bad options or option combinations."""


class NamesOptions:
    """A problem that names options by their fields: `field` is the options field, `value` (as shown) what it
    was given; `{field}` in the problem names an option (without a value, the problem then stands alone),
    and so does `{other}` for each field in `mentions`. Each front end renders these in its own words (`rendered`):
    `--batch-size 0: ...` on the command line, `key 'batch-size' = 0: ...` in a pipeline file. `flags`
    names the fields whose flag is not their name's (an output's format is `--to`); `where` is the place
    the problem was found in (a file and row, for a data error). A mixin, so that a data error
    (OptionInputError) or a destination error (OptionDestinationError) can name its option too."""

    def __init__(self, field: str, problem: str, *, value: str | None = None, mentions: Sequence[str] = (),
                 where: str = "", flags: Mapping[str, str] | None = None) -> None:
        self.field, self.problem, self.value, self.mentions, self.where = field, problem, value, tuple(mentions), where
        self.flags = dict(flags or {})
        super().__init__(self.rendered("cli"))

    def rendered(self, vocabulary: str) -> str:
        """The message with options named as the command line ("cli") or a pipeline file ("toml") names them."""
        def name(field: str) -> str:
            return self.flags.get(field, flag(field)) if vocabulary == "cli" else key(field)

        head = name(self.field) if vocabulary == "cli" else f"key {key(self.field)!r}"
        if self.value is not None:
            head += f" {self.value}" if vocabulary == "cli" else f" = {self.value}"
        problem = self.problem
        for other in {self.field, *self.mentions}:
            problem = problem.replace("{" + other + "}", name(other))
        if self.value is None and "{" + self.field + "}" in self.problem:  # it names the option where it reads best
            return f"{self.where}{problem}"
        return f"{self.where}{head}: {problem}"

    def at(self, where: str) -> NamesOptions:
        """The same problem, prefixed with the place it was found in (SRC, for a command)."""
        return type(self)(self.field, self.problem, value=self.value, mentions=self.mentions, where=f"{where}: ",
                          flags=self.flags)


class OptionError(NamesOptions, UsageError):
    """An option's value, or the column it names, is unusable. Here rather than with the option schemas
    (core/options.py) so that the output writer, the formats and the budget raise it too."""


def flag(field: str) -> str:
    """A field's command-line flag: batch_size -> --batch-size."""
    return "--" + key(field)


def key(field: str) -> str:
    """A field's pipeline-file key: batch_size -> batch-size."""
    return field.replace("_", "-")


class InputError(BatchtoolError):
    """Input that cannot be read as asked: missing, empty, unknown format, wrong column."""


class OptionInputError(NamesOptions, InputError):
    """Input that defeats an option: a value in a file and row that the option's value cannot take."""


class RowError(InputError):
    """A value at a row of a batch that cannot be processed, raised by code that knows only the row's place in the
    batch (an encoder): whoever knows where the batch's rows come from names the file and the row in it instead
    (`at`, dataset.Chunk.located), or, for a batch an operation made, the first such row of the input (`refind`:
    the row of another array of the column where the same problem is, or None; dataset.first_in_input).
    Unlocated, it says `row N of a batch`."""

    def __init__(self, row: int, column: str | None, problem: str,
                 refind: Callable[[Any], int | None] | None = None) -> None:
        self.row, self.column, self.problem, self.refind = row, column, problem, refind
        super().__init__(f"row {row} of a batch{'' if column is None else f', column {column!r}'}: {problem}")

    def at(self, place: str, note: str = "") -> InputError:
        """The same problem at `place` ('file, row N'), `note` after it."""
        return InputError(f"{place}{'' if self.column is None else f', column {self.column!r}'}: {self.problem}"
                          f"{note}")


class PartialError(InputError):
    """An input error found while the input streams, which knows only the rows seen so far; the driver raises
    `over_input(scan, locate)` instead: the same error over the whole input (counted by passes through `scan`, as
    ops.base.Context.scan makes them, its rows named by `locate`)."""

    def over_input(self, scan: Any, locate: Callable[[int], str]) -> InputError:
        raise NotImplementedError


class CorruptRecordError(InputError):
    """A record whose framing or CRC is wrong, or whose payload does not parse."""


class SchemaError(InputError):
    """A column is missing or has a type the operation cannot use."""


class OptionSchemaError(NamesOptions, SchemaError):
    """A column's values (in a file and row) that an option cannot take, or that the option would overwrite."""


class EngineError(BatchtoolError):
    """The engine lost what runs the work beyond its retries: a Ray task's every worker process, the node the
    command runs on, a result held by a node that died."""


class DestinationError(BatchtoolError):
    """DST or the tmp dir cannot be written: it overlaps an input, or the OS refuses (no space, no permission)."""


class OptionDestinationError(NamesOptions, DestinationError):
    """A directory an option names (--tmp-dir) that the OS refuses to write."""


class DestinationExistsError(DestinationError):
    """DST exists and --overwrite was not given."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to one line, for a one-line error naming the file."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def where(path: str | None = None, row: int | None = None, column: str | None = None,
          record: int | None = None, key: str | None = None) -> str:
    """Format the 'file, row/record, column' prefix every data error starts with."""
    parts = []
    if path is not None:
        parts.append(str(path))
    if record is not None:
        parts.append(f"record {record}")
    if row is not None:
        parts.append(f"row {row}")
    if key is not None:
        parts.append(f"key {key!r}")
    if column is not None:
        parts.append(f"column {column!r}")
    return ", ".join(parts)
