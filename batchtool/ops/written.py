"""The names a batchtool output's writer gave its own columns (bucket's `length`, segment's `sequence`, ...), read
from its manifest: what `batchtool.load`, `inspect` and `check` find those columns by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchtool.core.errors import InputError, OptionError
from batchtool.io.formats.base import BATCH_COLUMN
from batchtool.ops import OPERATIONS
from batchtool.ops.names import FIELD, RECORDED, OutputColumns, named
from batchtool.core.options import fields


def producer(manifest: Mapping[str, Any] | None) -> tuple[str | None, Mapping[str, Any], str]:
    """The op that wrote a batchtool output, its options and where they sit in the manifest: the command's, or for
    `run` its last stage's (keyed as the pipeline file wrote them)."""
    if not manifest:
        return None, {}, "options"
    options = manifest.get("options") or {}
    if manifest.get("command") == "run":
        stages = options.get("stages")
        if not isinstance(stages, list) or not stages or not isinstance(stages[-1], Mapping):
            return None, {}, "options.stages"
        return stages[-1].get("op"), stages[-1], f"options.stages[{len(stages) - 1}]"
    return manifest.get("command"), options, "options"


def written_names(manifest: Mapping[str, Any] | None, path: str) -> dict[str, str]:
    """{own column: its name} of a batchtool output's writer (bucket's `length`, segment's `sequence`, ...): the
    defaults, with the renames its manifest (file `path`) records; {} for another writer or no manifest. A malformed
    record is an InputError naming the file and the key."""
    op, options, at = producer(manifest)
    operation = OPERATIONS.get(op) if isinstance(op, str) else None
    kind = next((decl.value for f, decl in fields(operation.options) if f.name == FIELD), None) if operation else None
    if not isinstance(kind, OutputColumns):
        return {}
    pipeline = at != "options"
    key = "output-column" if pipeline else RECORDED
    given = options.get(key)
    if given is None or given == []:
        return named(kind.roles, ())
    if not pipeline and isinstance(given, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                        for p in given):
        given = dict(map(tuple, given))  # bucket's [[OUT, NAME], ...]
    try:
        return named(kind.roles, kind.parse(FIELD, given))
    except OptionError as exc:
        raise InputError(f"{path}: {at}.{key} is malformed ({exc.problem})") from None


def batched_rows(manifest: Mapping[str, Any] | None, path: str) -> str | None:
    """The op that wrote a batchtool output whose rows are not examples but padded, packed or segmented batch rows
    (it numbers them in a `batch` column of its own: bucket, pack, segment); None for any other input."""
    op, _, _ = producer(manifest)
    return op if BATCH_COLUMN in written_names(manifest, path) else None


__all__ = ["batched_rows", "producer", "written_names"]
