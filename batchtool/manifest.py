"""The manifest every run writes into DST: what was read, what was done, what was written.

Everything is deterministic except the `run` section (wall time, peak memory, threads),
so two runs with the same seed differ only there.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
from typing import Any

import pyarrow as pa

import batchtool
from batchtool import fs
from batchtool.dataset import MANIFEST_NAME, Dataset, schema_to_json
from batchtool.output import OutputOptions

FORMAT_VERSION = 1
_SAMPLE_BYTES = 1 << 20


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
                   "tfrecord_kind": output.tfrecord_kind if output.format == "tfrecord" else None,
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
