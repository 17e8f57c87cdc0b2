"""The manifest every run writes into DST (what was read, done, written): its name, how it is built and written,
its schema's encoding, and the one check of every path it gives (its reader is batchtool.io.manifest_reader).

Everything is deterministic except the `run` section (wall time, peak memory, threads),
so two runs with the same seed differ only there.
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

from batchtool.core import fs
from batchtool.core.errors import InputError, first_line
from batchtool.core.version import version

if TYPE_CHECKING:
    from batchtool.io.dataset import Dataset

MANIFEST_NAME = ".batchtool_manifest.json"
"""A leading dot, because that is what every directory reader skips: pyarrow, pandas and
pyarrow.dataset skip names starting with `.` or `_`, Hugging Face `datasets` only those starting with `.`."""
LEGACY_MANIFEST_NAME = "manifest.json"
"""The name batchtool 0.1 wrote: still read (after MANIFEST_NAME), never written."""
FORMAT_VERSION = 3
"""The newest manifest_version this batchtool reads. Outputs are written as version 1 unless their batches are
padded by the loader (`bucket --padding on-load`, output.padding): those are version 2, or their record batches
hold several batches each (output.stacked_batch_rows): version 3. A batchtool that predates either refuses it in
one line rather than handing out ragged arrays where padded ones were meant, or stacks where batches were."""
PLAIN_VERSION = 1
PADDED_ON_LOAD_VERSION = 2
STACKED_VERSION = 3
STACKED_ROWS = "stacked_batch_rows"
"""The output section's field saying that every batch has this many rows and each Arrow IPC record batch holds
consecutive batches (its rows / this many): absent where each record batch is one batch."""
_SAMPLE_BYTES = 1 << 20


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


def inputs_entry(dataset: Dataset) -> dict[str, Any]:
    """What a manifest records of its input: SRC, its format and files; for a mix, each source in order (its index
    in the source column, name, SRC, format and how many of the files are its)."""
    entry = {"src": dataset.src, "format": dataset.format, **dataset.spec.recorded(dataset),
             "files": input_entries(dataset)}
    parts = dataset.parts()
    if any(part.name is not None for part in parts):
        entry["sources"] = [{"index": i, "name": part.name, "src": part.dataset.src, "format": part.dataset.format,
                             **part.dataset.spec.recorded(part.dataset), "files": len(part.dataset.shards)}
                            for i, part in enumerate(parts)]
    return entry


def schema_entries(schema: pa.Schema) -> list[dict]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def schema_to_json(schema: pa.Schema) -> str:
    """Arrow schema as base64 IPC bytes: exact, so a round trip through a format that records no schema restores
    every type."""
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


def new_manifest(*, command: str, options: dict[str, Any], seed: int | None, dataset: Dataset,
          output: dict[str, Any], schema: pa.Schema, files: list[dict], stats: dict[str, Any],
          run: dict[str, Any], padding: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest; `output`: how the output is written (output.OutputOptions.recorded); `padding`: how
    batchtool.load pads the stored batches (batchtool.io.load_padding), if it does."""
    manifest = {
        "batchtool_version": version(),
        "manifest_version": (STACKED_VERSION if output.get(STACKED_ROWS) else
                             PLAIN_VERSION if padding is None else PADDED_ON_LOAD_VERSION),
        "command": command,
        "options": options,
        "seed": seed,
        "inputs": inputs_entry(dataset),
        "output": {**output,
                   "rows": sum(f["rows"] for f in files), "batches": sum(f["batches"] for f in files),
                   "bytes": sum(f["bytes"] for f in files), "files": files},
        "schema": schema_to_json(schema),
        "columns": schema_entries(schema),
        "stats": stats,
        "run": run,
    }
    if padding is not None:
        manifest["output"]["padding"] = padding
    return manifest


def write_file(directory: str, manifest: dict[str, Any]) -> None:
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
    """The data files a manifest (from manifest_reader.read_manifest, so already checked) lists, in its order."""
    return [OutputFile(fs.join(src, f["path"]), f["path"], f["rows"], f["batches"], f["bytes"], f["sha256"])
            for f in manifest["output"]["files"]]


def index_files(src: str, manifest: dict) -> list[OutputFile]:
    """The example index a manifest (checked, as for output_files) records, as a file to verify by size and sha256
    (rows: its examples; no batches), or none."""
    entry = manifest["output"].get("index")
    if entry is None:
        return []
    return [OutputFile(fs.join(src, entry["path"]), entry["path"], entry["examples"], 0, entry["bytes"],
                       entry["sha256"])]
