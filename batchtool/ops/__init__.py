"""The operations, each one module; OPERATIONS registers those written to the operation interface (ops/base.py)."""

from __future__ import annotations

from batchtool.ops import bucket as bucket_op
from batchtool.ops import filter as filter_op
from batchtool.ops import mix as mix_op
from batchtool.ops import pack as pack_op
from batchtool.ops import rename as rename_op
from batchtool.ops import resample as resample_op
from batchtool.ops import segment as segment_op
from batchtool.ops import select as select_op
from batchtool.ops import shuffle as shuffle_op
from batchtool.ops import stratify as stratify_op
from batchtool.ops.base import Operation

OPERATIONS: dict[str, Operation] = {
    "filter": filter_op.OP,
    "select": select_op.OP,
    "rename": rename_op.OP,
    "resample": resample_op.OP,
    "stratify": stratify_op.OP,
    "pack": pack_op.OP,
    "bucket": bucket_op.OP,
    "segment": segment_op.OP,
    "shuffle": shuffle_op.OP,
    "mix": mix_op.OP,
}
"""Name -> definition: the command, the pipeline stage and the dry run of each are derived from it."""

__all__ = ["OPERATIONS", "Operation"]
