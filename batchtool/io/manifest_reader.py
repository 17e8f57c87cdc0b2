"""The one reader of a manifest: read whole and checked once, so that every consumer (open_dataset, load, inspect,
check) then trusts its types and its file paths, which never leave the dataset directory."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from batchtool.core import fs
from batchtool.core.errors import InputError
from batchtool.io.formats.registry import FORMATS, NAMES, recorded_choices, stacking
from batchtool.io.load_padding import LoadPadding
from batchtool.io.manifest import (FORMAT_VERSION, LEGACY_MANIFEST_NAME, STACKED_ROWS, dataset_file, manifest_path,
                                   schema_from_json)

MAX_MANIFEST_BYTES = 256 << 20
"""A manifest is read whole; one this large is not batchtool's (a million shards take ~200 MB)."""


def read_manifest(src: str) -> dict | None:
    """The manifest of directory SRC, validated whole (InputError naming the field otherwise), or None.

    A legacy `manifest.json` that is not a JSON object with a batchtool_version is some other
    tool's file, not a batchtool output's, and is ignored rather than refused.
    """
    path = manifest_path(src)
    if not fs.is_file(path):
        return None
    legacy = os.path.basename(path) == LEGACY_MANIFEST_NAME
    try:
        data = _load_json(src, path)
    except InputError:
        if legacy:
            return None
        raise
    if legacy and not (isinstance(data, dict) and "batchtool_version" in data):
        return None
    return validate(data, path, src)


def read_manifest_file(path: str) -> dict:
    """A manifest named by its own path (`check --baseline out/.batchtool_manifest.json`), validated whole."""
    src = os.path.dirname(path) or "."
    return validate(_load_json(src, path), path, src)


def _load_json(src: str, path: str) -> Any:
    dataset_file(src, os.path.basename(path), f"{src}: the manifest")
    return fs.read_json(path, MAX_MANIFEST_BYTES, "a batchtool manifest", "unreadable manifest")



_NON_NEGATIVE = "a non-negative integer"
_TOP_LEVEL: dict[str, tuple[tuple[type, ...], str]] = {
    "batchtool_version": ((str,), "a string"),
    "manifest_version": ((int,), "an integer"),
    "command": ((str,), "a string"),
    "options": ((dict,), "an object"),
    "seed": ((int, type(None)), "an integer or null"),
    "inputs": ((dict,), "an object"),
    "columns": ((list,), "a list"),
    "stats": ((dict,), "an object"),
    "run": ((dict,), "an object"),
}
"""Fields a reader may use, each with its type: checked when present (only output and schema are required)."""


def validate(data: Any, path: str, src: str) -> dict:
    """`data` if it is a manifest every consumer can trust: types, counts, schema and file paths."""
    def refuse(field: str, value: Any, expected: str) -> InputError:
        shown = repr(value) if len(repr(value)) <= 60 else f"{type(value).__name__} {repr(value)[:40]}..."
        return InputError(f"{path}: {field} is {shown}, expected {expected}")

    def count(obj: dict, key: str, field: str) -> None:
        value = obj.get(key)
        if not _is_int(value) or not 0 <= value < 2**63:
            raise refuse(field, value, _NON_NEGATIVE)

    if not isinstance(data, dict):
        raise refuse("the manifest", data, "a JSON object")
    for key in ("output", "schema"):
        if key not in data:
            raise InputError(f"{path}: no {key!r} section (not a batchtool manifest, or a damaged one)")
    for key, (types, expected) in _TOP_LEVEL.items():
        value = data.get(key)
        if key in data and (not isinstance(value, types) or isinstance(value, bool)):
            raise refuse(key, value, expected)
    if data.get("manifest_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise InputError(f"{path}: manifest_version {data['manifest_version']} was written by a newer batchtool "
                         f"(this one reads up to {FORMAT_VERSION}); upgrade batchtool")
    output = data["output"]
    if not isinstance(output, dict):
        raise refuse("output", output, "an object")
    if output.get("format") not in NAMES:
        raise refuse("output.format", output.get("format"), " or ".join(map(repr, NAMES)))
    for name, choices in recorded_choices().items():
        if output.get(name) is not None and output[name] not in choices:
            raise refuse(f"output.{name}", output[name], " or ".join(map(repr, choices)))
    if not isinstance(output.get("compression", ""), (str, type(None))):
        raise refuse("output.compression", output["compression"], "a string")
    for key in ("rows", "batches", "bytes"):
        count(output, key, f"output.{key}")
    stacked = output.get(STACKED_ROWS)
    if stacked is not None and (not _is_int(stacked) or stacked < 1 or not FORMATS[output["format"]].stores_stacks):
        raise refuse(f"output.{STACKED_ROWS}", stacked, "a positive count of rows, for a format that stores stacks "
                                                        f"({stacking()})")
    files = output.get("files")
    if not isinstance(files, list):
        raise refuse("output.files", files, "a list")
    seen: set[str] = set()
    for i, entry in enumerate(files):
        field = f"output.files[{i}]"
        if not isinstance(entry, dict):
            raise refuse(field, entry, "an object")
        if not isinstance(entry.get("path"), str):
            raise refuse(f"{field}.path", entry.get("path"), "a relative file path")
        dataset_file(src, entry["path"], f"{path}: {field}.path")
        if posixpath.normpath(entry["path"]) in seen:
            raise InputError(f"{path}: {field}.path {entry['path']!r} is listed twice")
        seen.add(posixpath.normpath(entry["path"]))
        for key in ("rows", "batches", "bytes"):
            count(entry, key, f"{field}.{key}")
        if not (isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64):
            raise refuse(f"{field}.sha256", entry.get("sha256"), "64 hex digits")
    index = output.get("index")
    if index is not None:  # the example index (batchtool.io.example_index), checked as the files are
        if not isinstance(index, dict):
            raise refuse("output.index", index, "an object")
        if not isinstance(index.get("path"), str):
            raise refuse("output.index.path", index.get("path"), "a relative file path")
        dataset_file(src, index["path"], f"{path}: output.index.path")
        if posixpath.normpath(index["path"]) in seen:
            raise InputError(f"{path}: output.index.path {index['path']!r} is also a data file")
        for key in ("examples", "bytes"):
            count(index, key, f"output.index.{key}")
        if not (isinstance(index.get("sha256"), str) and len(index["sha256"]) == 64):
            raise refuse("output.index.sha256", index.get("sha256"), "64 hex digits")
        if not isinstance(index.get("key"), (str, type(None))):
            raise refuse("output.index.key", index.get("key"), "a column name or null")
    if not isinstance(data["schema"], str):
        raise refuse("schema", data["schema"], "a base64 Arrow IPC schema")
    try:
        schema = schema_from_json(data["schema"])
    except ValueError as exc:
        raise InputError(f"{path}: schema does not decode as a base64 Arrow IPC schema ({exc})") from exc
    if "padding" in output:
        LoadPadding.of(output["padding"], schema, path)
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
