"""Every shard format by name (Parquet, TFRecord, Arrow IPC): what --to, --format and a manifest name, and what a
file's name or first bytes say it is."""

from __future__ import annotations

from batchtool.core.errors import UsageError
from batchtool.io.formats.arrow import ArrowFormat
from batchtool.io.formats.base import Format
from batchtool.io.formats.parquet import ParquetFormat
from batchtool.io.formats.tfrecord.format import TFRecordFormat

FORMATS: dict[str, Format] = {f.name: f for f in (ParquetFormat(), TFRecordFormat(), ArrowFormat())}
"""Every format batchtool reads and writes, by the name --to, --format and the manifest use."""
NAMES = tuple(FORMATS)
DEFAULT = ParquetFormat.name
"""The format written when none is asked for."""


def get(name: str) -> Format:
    """The format called `name`; UsageError listing the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise UsageError(f"--to {name!r}: expected {', '.join(NAMES)}") from None


def detect(path: str, head: bytes | None = None) -> str | None:
    """The format of a file by its name, or by its first bytes (`head`) when given."""
    by_name = next((f.name for f in FORMATS.values() if f.detect(path)), None)
    if by_name is not None or head is None:
        return by_name
    return next((f.name for f in FORMATS.values() if f.detect("", head)), None)
