"""What the writer of a batch-shard output fixes for the loader (ops.written.Written): lanes that carry state (segment)
or batches laid out by step for a number of ranks (pack --world-size), and what to do when a load asks otherwise."""

from __future__ import annotations

from collections.abc import Callable

from batchtool.ops.written import Written


def fixed(writer: Written) -> Callable[[int, int], str] | None:
    """Why each rank's stream is fixed when written, and what to do, for two world sizes that differ (a saved
    state's or the output's, and the loader's); None where batches are independent and any number of ranks can
    share them."""
    op, written = writer.op, writer.ranks
    if writer.lanes:
        return lambda _, asked: (f"{op} output's lanes carry state from batch to batch, so each rank's stream is "
                                 f"fixed when it is written; write it again with `{op} --world-size {asked}` "
                                 "(and start that run from its first batch)")
    if written is not None:
        def balanced(saved: int, asked: int) -> str:
            other = asked if asked != written else saved
            return (f"{op} output balanced for --world-size {written}: each step's rows are balanced across "
                    f"exactly {written} ranks; load it with world_size={written}, or run {op} again with "
                    f"`--world-size {other}`")
        return balanced
    return None


__all__ = ["fixed"]
