"""The one exception hierarchy: every failure a user can cause is a BatchtoolError."""

from __future__ import annotations


class BatchtoolError(Exception):
    """A failure the user can fix; the CLI prints it as one line and exits 2."""

    exit_code = 2


class UsageError(BatchtoolError):
    """Bad options or option combinations."""


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
