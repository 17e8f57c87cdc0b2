"""Every shard format by name: what --to, --format and a manifest name, and what a file's name or first bytes say
it is. A new format is one module and one entry of FORMATS (docs/internals.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from batchtool.core.errors import UsageError
from batchtool.core.options import Choice, fields
from batchtool.core.registry import Registry
from batchtool.io.formats.declared import DECLARED, RECORDED_OPTIONS

if TYPE_CHECKING:
    from batchtool.io.formats.base import Format, Reader
    from batchtool.io.formats.declared import Declared

FORMATS: Registry[Reader] = Registry({
    "parquet": "batchtool.io.formats.parquet",
    "tfrecord": "batchtool.io.formats.tfrecord.format",
    "arrow": "batchtool.io.formats.arrow",
}, "FORMAT")
"""Every format batchtool reads, by the name --format and the manifest use (each module defines its FORMAT, imported
when that format is first asked for: naming the formats imports none); those it also writes (a Format: reader, writer
and batch index) by the name --to uses. What the functions below list comes from each format's declaration
(`declared`), so --help and the option schemas import no format's module that io/formats/declared.py declares."""
NAMES = tuple(FORMATS)
DEFAULT = "parquet"
"""The format written when none is asked for."""


def declared(name: str) -> Declared | Reader:
    """What format `name` says of itself: its declaration (io/formats/declared.py, importing no codec), else the
    format itself (one registered with no declaration: its module imported to ask it)."""
    return DECLARED.get(name) or FORMATS[name]


def written() -> tuple[str, ...]:
    """The names of the formats batchtool writes (--to)."""
    return tuple(n for n in FORMATS if declared(n).writes)


def get(name: str) -> Format:
    """The written format called `name`; UsageError listing them otherwise."""
    if name not in written():
        raise UsageError(f"--to {name!r}: expected {', '.join(written())}")
    return FORMATS[name]


def recorded_choices() -> dict[str, tuple[str, ...]]:
    """The write options a manifest records (RECORDED_OPTIONS) that are one of a few words, with those words: what a
    manifest read back may say of them."""
    return {f.name: decl.value.choices for name in written() if (options := declared(name).write_options) is not None
            for f, decl in fields(options) if f.name in RECORDED_OPTIONS and isinstance(decl.value, Choice)}


def checksummed() -> str:
    """The formats whose records carry checksums (the ones --skip-corrupt skips), as a message lists them."""
    return " or ".join(d.label for d in map(declared, FORMATS) if d.record_checksums)


def stacking() -> str:
    """The written formats that store stacks of batches (Format.stores_stacks), as messages list them."""
    return listed([get(name).label for name in written() if get(name).stores_stacks])


def narrowing() -> str:
    """The formats whose output holds floats as float32 only, as a message lists them: 'TFRecord'."""
    return " or ".join(d.label for d in map(declared, FORMATS) if d.writes and d.float32_only)


def listed(words: Sequence[str]) -> str:
    """Words as a message lists them: 'a, b or c'."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else "".join(words)


def format_labels() -> str:
    """The formats as a message lists them: 'Parquet, TFRecord or Arrow IPC'."""
    return listed([d.label for d in map(declared, FORMATS)])


def suffixes() -> str:
    """Each format's first file name ending, as a message lists them."""
    return listed([d.suffixes[0] for d in map(declared, FORMATS)])


def detect(path: str, head: bytes | None = None) -> str | None:
    """The format of a file by its name, or by its first bytes (`head`) when given."""
    by_name = next((f.name for f in FORMATS.values() if f.detect(path)), None)
    if by_name is not None or head is None:
        return by_name
    return next((f.name for f in FORMATS.values() if f.detect("", head)), None)
