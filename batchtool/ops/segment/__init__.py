"""`segment`: split sequences into `num_unroll`-step segments, batched lane by lane for truncated BPTT.

Each of the B rows of a batch is a lane that plays one example's segments in order in
consecutive batches, then the next example's, so a trainer keeps its recurrent state as a
`[B, ...]` array and resets lane b where `sequence[b] == 0`. This package declares the op; ops.segment.op runs it
(plan, the one regrouping pass, dry run); the pass's parts each have their own:
ops.segment.chunks (per-chunk checks and segment counts), ops.segment.lanes (the sequential lane planner) and
ops.segment.batches (building batches on workers); the keys are checked unique by the runtime's distinct-keys check
(batchtool.exec.distinct), as check's unique rule is.
"""

from __future__ import annotations

from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Kind, OutputRows
from batchtool.ops.segment.options import SegmentOptions

DECLARED = Declaration(
    "segment",
    summary="""Split sequences into --num-unroll-step segments and write lane-stable batches for truncated BPTT.

    Row b of every batch is lane b: it plays one example's segments in order in
    consecutive batches, then the next example's, so a trainer carries its state per
    lane and resets lane b where sequence == 0. Read the output with
    batchtool.load(DST). With --world-size N, each of N training ranks gets its own B
    lanes and the same number of batches.
    """,
    example=("batchtool segment sample_data/parquet /tmp/seg --key key --sequence tokens,frames "
             "--context label --num-unroll 20 --batch-size 32"),
    options=SegmentOptions,
    kind=Kind.BATCHES,
    spills=("memory",),
    batches_flag=True,
    output_rows=OutputRows.SEGMENTS)


__getattr__ = exports(globals(), {name: ("batchtool.ops.segment.op", name) for name in (
    "OP", "SegmentOp", "check_memory")})

__all__ = ["DECLARED", "OP", "SegmentOp", "SegmentOptions", "check_memory"]
