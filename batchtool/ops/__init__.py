"""The operations, each one module; OPERATIONS registers those written to the operation interface (ops/base.py)."""

from __future__ import annotations

from batchtool.ops import filter as filter_op
from batchtool.ops import rename as rename_op
from batchtool.ops import resample as resample_op
from batchtool.ops import select as select_op
from batchtool.ops import shuffle as shuffle_op
from batchtool.ops import stratify as stratify_op
from batchtool.ops.base import Operation

OPERATIONS: dict[str, Operation] = {
    "filter": filter_op.OP,
    "select": select_op.OP,
    "rename": rename_op.OP,
    "resample": resample_op.OP,
    "shuffle": shuffle_op.OP,
}
"""Name -> definition: the command, the pipeline stage and the dry run of each are derived from it."""

DEFINED: dict[str, Operation] = {**OPERATIONS, "stratify": stratify_op.OP}
"""Every op with a definition: its command and pipeline keys come from its schema. Those not in OPERATIONS
still run their own passes and writer (and have their own pipeline stage)."""

__all__ = ["DEFINED", "OPERATIONS", "Operation"]
