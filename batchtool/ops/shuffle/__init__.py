"""`shuffle`: an exact seeded global permutation in bounded memory, or shuffle_batch's buffered shuffle.

This package declares the op (DECLARED); ops.shuffle.op runs it (the global shuffle's exchange, the buffered
shuffle as it streams, the output batches' sizes and the budget)."""

from __future__ import annotations

from dataclasses import dataclass

from batchtool.core.options import Flag, Integer, option
from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Depends, Kind, OptionError, Shape


@dataclass(frozen=True)
class ShuffleOptions:
    """What `shuffle` computes."""

    batch_size: int | None = option("Write batches (row groups) of this many rows.", Integer(), None)
    drop_remainder: bool = option("Drop the final batch if it is smaller than --batch-size.", Flag(), False)
    buffer: int | None = option("Buffered shuffle (shuffle_batch's capacity) instead of a global one.", Integer(),
                                None)
    min_after_dequeue: int | None = option("shuffle_batch's min_after_dequeue; alone it sets the buffer to it plus "
                                           "the batch size.", Integer(), None)

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError("batch_size", "must be at least 1", value=str(self.batch_size))
        if self.drop_remainder and self.batch_size is None:
            raise OptionError("drop_remainder", "{drop_remainder} needs {batch_size} (the final partial batch is "
                              "what it drops)", mentions=["batch_size"])
        if self.buffer is not None and self.buffer < 1:
            raise OptionError("buffer", "must be at least 1 row", value=str(self.buffer))
        if self.min_after_dequeue is not None and self.min_after_dequeue < 0:
            raise OptionError("min_after_dequeue", "must be >= 0", value=str(self.min_after_dequeue))
        if self.buffer is not None and self.min_after_dequeue is not None and self.min_after_dequeue >= self.buffer:
            raise OptionError("min_after_dequeue", f"{{min_after_dequeue}} {self.min_after_dequeue} must be smaller "
                              f"than {{buffer}} {self.buffer} (shuffle_batch's capacity)", mentions=["buffer"])

    @property
    def buffered(self) -> bool:
        return self.buffer is not None or self.min_after_dequeue is not None

    @property
    def capacity(self) -> int:
        """Rows the buffered shuffle draws from: --buffer, or the smallest capacity shuffle_batch allowed."""
        if self.buffer is not None:
            return self.buffer
        return (self.min_after_dequeue or 0) + (self.batch_size or 1)


def _shape(options: ShuffleOptions) -> Shape:
    return Shape(Kind.BATCHES if options.batch_size is not None else Kind.REORDERS, Depends.ORDER)


DECLARED = Declaration(
    "shuffle",
    summary="""Shuffle SRC into DST: an exact seeded permutation in bounded memory, or the buffered shuffle of
    tf.compat.v1.train.shuffle_batch.""",
    example="batchtool shuffle sample_data/parquet /tmp/shuffled --memory 256MB --seed 1",
    options=ShuffleOptions,
    kind=Kind.REORDERS,
    seeded=True,
    spills=("memory", "tmp_dir"),
    shaped=_shape)


__getattr__ = exports(globals(), {name: ("batchtool.ops.shuffle.op", name) for name in (
    "OP", "STAGE", "BufferedShuffle", "Shuffle", "ShufflePlan", "buffered_shuffle", "check_memory",
    "default_batch_rows", "layout", "output_batch_rows", "shuffle_stats")})

__all__ = ["DECLARED", "OP", "STAGE", "BufferedShuffle", "Shuffle", "ShuffleOptions", "ShufflePlan",
           "buffered_shuffle", "check_memory", "default_batch_rows", "layout", "output_batch_rows", "shuffle_stats"]
