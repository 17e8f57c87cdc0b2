"""The manifest every run writes into DST (what was read, done, written), and the one reader that validates it.

Everything is deterministic except the `run` section (wall time, peak memory, threads),
so two runs with the same seed differ only there. A manifest read back is checked whole,
once, in read_manifest: every consumer (open_dataset, load, inspect, check) then trusts its
types and its file paths, which never leave the dataset directory.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import posixpath
import resource
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import batchtool
from batchtool import fs
from batchtool.formats import registry
from batchtool.errors import InputError, first_line
from batchtool.output import TFRECORD_KINDS, OutputOptions

if TYPE_CHECKING:
    from batchtool.dataset import Dataset

MANIFEST_NAME = ".batchtool_manifest.json"
"""A leading dot, because that is what every directory reader skips: pyarrow, pandas and
pyarrow.dataset skip names starting with `.` or `_`, Hugging Face `datasets` only those starting with `.`."""
LEGACY_MANIFEST_NAME = "manifest.json"
"""The name batchtool 0.1 wrote: still read (after MANIFEST_NAME), never written."""
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 256 << 20
"""A manifest is read whole; one this large is not batchtool's (a million shards take ~200 MB)."""
_SAMPLE_BYTES = 1 << 20
_OUTPUT_FORMATS = registry.NAMES


@dataclass(frozen=True)
class OutputFile:
    """One data file a manifest lists, with its path inside the dataset directory."""

    path: str
    """The file to open: the dataset directory joined with `name`."""
    name: str
    """As the manifest lists it, relative to the dataset directory."""
    rows: int
    batches: int
    bytes: int
    sha256: str


def fingerprint(path: str, size: int) -> str:
    """sha256 of the size and the first and last MiB: cheap on huge inputs, and catches rewrites."""
    h = hashlib.sha256(str(size).encode())
    with fs.open_input(path) as f:
        h.update(f.read(_SAMPLE_BYTES))
        if size > 2 * _SAMPLE_BYTES:
            f.seek(size - _SAMPLE_BYTES)
            h.update(f.read(_SAMPLE_BYTES))
        elif size > _SAMPLE_BYTES:
            h.update(f.read())
    return "sha256-ends:" + h.hexdigest()


def input_entries(dataset: Dataset) -> list[dict]:
    return [{"path": s.path if fs.is_uri(s.path) else os.path.abspath(s.path), "bytes": s.size, "fingerprint": fingerprint(s.path, s.size)}
            for s in dataset.shards]


def schema_entries(schema: pa.Schema) -> list[dict]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def schema_to_json(schema: pa.Schema) -> str:
    """Arrow schema as base64 IPC bytes: exact, so a TFRecord round trip restores every type."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_json(text: str) -> pa.Schema:
    """The schema schema_to_json wrote; ValueError for anything else."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (binascii.Error, pa.ArrowException) as exc:
        raise ValueError(first_line(exc)) from exc


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def build(*, command: str, options: dict[str, Any], seed: int | None, dataset: Dataset,
          output: OutputOptions, schema: pa.Schema, files: list[dict], stats: dict[str, Any],
          run: dict[str, Any]) -> dict[str, Any]:
    return {
        "batchtool_version": batchtool.__version__,
        "manifest_version": FORMAT_VERSION,
        "command": command,
        "options": options,
        "seed": seed,
        "inputs": {"src": dataset.src, "format": dataset.format, "tfrecord_kind": dataset.tfrecord_kind,
                   "files": input_entries(dataset)},
        "output": {"format": output.format, "compression": output.codec,
                   "tfrecord_kind": output.spec.record_kind(output),
                   "rows": sum(f["rows"] for f in files), "batches": sum(f["batches"] for f in files),
                   "bytes": sum(f["bytes"] for f in files), "files": files},
        "schema": schema_to_json(schema),
        "columns": schema_entries(schema),
        "stats": stats,
        "run": run,
    }


def write(directory: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")


def _json_default(value: Any) -> Any:
    """NumPy scalars and arrays show up in stats; store them as plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def manifest_path(src: str) -> str:
    """Where the manifest of directory SRC is (or would be): the legacy name only when that file exists alone."""
    path = fs.join(src, MANIFEST_NAME)
    legacy = fs.join(src, LEGACY_MANIFEST_NAME)
    return legacy if not fs.is_file(path) and fs.is_file(legacy) else path


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
    size = fs.file_size(path)
    if size > MAX_MANIFEST_BYTES:
        raise InputError(f"{path}: {size:,} bytes, too large for a batchtool manifest "
                         f"(at most {MAX_MANIFEST_BYTES:,})")
    try:
        return json.loads(fs.read_text(path))
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable manifest ({first_line(exc)})") from exc


def dataset_file(src: str, name: str, what: str) -> str:
    """SRC/name, if `name` is relative and stays inside SRC after `..` and symlinks are resolved.

    The one check of every path a manifest gives: anything else is an InputError that starts
    with `what` (the manifest and the entry) and never touches the file.
    """
    def refuse(why: str) -> InputError:
        return InputError(f"{what} {name!r} {why}")

    if not name or "\0" in name:
        raise refuse("is not a file name")
    if fs.is_uri(name) or posixpath.isabs(name) or os.path.isabs(name):
        raise refuse("is absolute; paths in a manifest are relative to its directory")
    if fs.is_uri(src):
        norm = posixpath.normpath(name)
        if norm in (".", "..") or norm.startswith("../"):
            raise refuse("leaves the dataset directory")
        return fs.join(src, norm)
    root = os.path.realpath(src)
    lexical = os.path.normpath(os.path.join(root, name))
    resolved = os.path.realpath(lexical)
    for target in (lexical, resolved):
        if target == root or os.path.commonpath([root, target]) != root:
            link = f" (through a symlink to {resolved})" if target is resolved else ""
            raise refuse(f"leaves the dataset directory{link}")
    return fs.join(src, name)


def output_files(src: str, manifest: dict) -> list[OutputFile]:
    """The data files a manifest (from read_manifest, so already checked) lists, in its order."""
    return [OutputFile(fs.join(src, f["path"]), f["path"], f["rows"], f["batches"], f["bytes"], f["sha256"])
            for f in manifest["output"]["files"]]


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
    if output.get("format") not in _OUTPUT_FORMATS:
        raise refuse("output.format", output.get("format"), " or ".join(map(repr, _OUTPUT_FORMATS)))
    if output.get("tfrecord_kind") is not None and output["tfrecord_kind"] not in TFRECORD_KINDS:
        raise refuse("output.tfrecord_kind", output["tfrecord_kind"], " or ".join(map(repr, TFRECORD_KINDS)))
    if not isinstance(output.get("compression", ""), (str, type(None))):
        raise refuse("output.compression", output["compression"], "a string")
    for key in ("rows", "batches", "bytes"):
        count(output, key, f"output.{key}")
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
    if not isinstance(data["schema"], str):
        raise refuse("schema", data["schema"], "a base64 Arrow IPC schema")
    try:
        schema_from_json(data["schema"])
    except ValueError as exc:
        raise InputError(f"{path}: schema does not decode as a base64 Arrow IPC schema ({exc})") from exc
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
