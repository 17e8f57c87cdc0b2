"""mix --pad: its balanced batches padded to their longest row where they are read (a module of its own, which the
op imports where it runs)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from batchtool.io.example_ids import carry, taken
from batchtool.io.padding import BatchPadding
from batchtool.ops.regroup import Cut, Runtime, Scattered, SortedBatches


def padded_cut(padding: BatchPadding, cut: Callable[[Scattered, Runtime], Cut], scattered: Scattered,
               runtime: Runtime) -> Cut:
    """--pad: the balanced batches' cut, each batch padded where it is read."""
    made = cut(scattered, runtime)
    return replace(made, batches=PaddedBatches(made.batches, padding, len(scattered.schema)))


@dataclass(frozen=True)
class PaddedBatches(SortedBatches):
    """Batches (ops.regroup.SortedBatches) padded to their longest row as they are read: the same rows, in the same
    order."""

    batches: SortedBatches
    padding: BatchPadding
    width: int
    """The columns of a batch before padding (its carried example ids after them)."""

    @property
    def firsts(self) -> np.ndarray:  # type: ignore[override]
        return self.batches.firsts

    def nbytes(self) -> int:
        return self.batches.nbytes()

    def reader(self, start: int, end: int) -> Callable[[], Iterator[pa.RecordBatch]]:
        return functools.partial(_padded_run, self.padding, self.width, self.batches.reader(start, end))


def _padded_run(padding: BatchPadding, width: int,
                read: Callable[[], Iterator[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """Each batch padded, the example ids it carries (batchtool.io.example_ids) kept last."""
    for batch in read():
        data, ids = taken(batch, width)
        yield padding(data) if ids is None else carry(padding(data), ids)
