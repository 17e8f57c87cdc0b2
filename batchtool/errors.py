"""The one exception hierarchy: every failure a user can cause is a BatchtoolError."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class BatchtoolError(Exception):
    """A failure the user can fix; the CLI prints it as one line and exits 2."""

    exit_code = 2


class UsageError(BatchtoolError):
    """Bad options or option combinations."""


class OptionError(UsageError):
    """An option's value, or the column it names, is unusable. `field` is the options field, `value` (as
    shown) what it was given; `{field}` in the problem names an option (the problem then stands alone).
    Each front end renders these in its own words (`rendered`): `--batch-size 0: ...` on the command
    line, `key 'batch-size' = 0: ...` in a pipeline file. `flags` names the fields whose flag is not
    their name's (an output's format is `--to`). Here rather than with the option schemas (ops/base.py)
    so that the output writer and the formats raise it too."""

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
        if "{" + self.field + "}" in self.problem:  # it names the option itself, where it reads best
            return f"{self.where}{problem}"
        return f"{self.where}{head}: {problem}"

    def at(self, where: str) -> OptionError:
        """The same problem, prefixed with the place it was found in (SRC, for a command)."""
        return type(self)(self.field, self.problem, value=self.value, mentions=self.mentions, where=f"{where}: ",
                          flags=self.flags)


def flag(field: str) -> str:
    """A field's command-line flag: batch_size -> --batch-size."""
    return "--" + key(field)


def key(field: str) -> str:
    """A field's pipeline-file key: batch_size -> batch-size."""
    return field.replace("_", "-")


class InputError(BatchtoolError):
    """Input that cannot be read as asked: missing, empty, unknown format, wrong column."""


class CorruptRecordError(InputError):
    """A TFRecord record whose framing or CRC is wrong, or whose payload does not parse."""


class SchemaError(InputError):
    """A column is missing or has a type the operation cannot use."""


class DestinationError(BatchtoolError):
    """DST or the tmp dir cannot be written: it overlaps an input, or the OS refuses (no space, no permission)."""


class DestinationExistsError(DestinationError):
    """DST exists and --overwrite was not given."""


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
