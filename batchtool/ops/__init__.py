"""The operations, each one module; OPERATIONS registers those written to the operation interface (ops/base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchtool.core.registry import Registry

if TYPE_CHECKING:
    from batchtool.ops.base import Operation

OPERATIONS: Registry[Operation] = Registry({
    "filter": "batchtool.ops.filter",
    "select": "batchtool.ops.select",
    "rename": "batchtool.ops.rename",
    "resample": "batchtool.ops.resample",
    "stratify": "batchtool.ops.stratify",
    "pack": "batchtool.ops.pack",
    "bucket": "batchtool.ops.bucket",
    "segment": "batchtool.ops.segment",
    "shuffle": "batchtool.ops.shuffle",
    "mix": "batchtool.ops.mix",
}, "OP")
"""Name -> definition (each op's module defines its OP, imported when that op is first asked for: a command imports the
op it runs, not every op): the command, the pipeline stage and the dry run of each are derived from it."""

__all__ = ["OPERATIONS"]
