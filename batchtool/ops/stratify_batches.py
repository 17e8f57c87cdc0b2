"""stratify with --batch-size: its selected rows cut into batches, or spilled by class and dealt out as balanced
batches (each batch its exact share of every class); stratify's regrouping (Operation.regroup)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import budget, rng
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.ops.base import Operation, Regrouped, Runtime, Tally
from batchtool.ops.quotas import QuotaLayout, plan_layout
from batchtool.ops.keyed import PART_SHARE, keyed_spill, spill_streams
from batchtool.ops.rows import RowReader, bytes_per_row, emit, estimate_memory_bytes, peek, rebatch
from batchtool.ops.stratify_plans import STAGE
from batchtool.spill import parts_for

from batchtool.ops.stratify_plans import Stratification


def balanced_batches(streams: list[RowReader], layout: QuotaLayout, seed: int, schema: pa.Schema) -> Iterator[Chunk]:
    """Each batch takes its quota from every class's keyed random stream and is shuffled by keyed order.

    The class streams are uniformly random, so consecutive batches are already in random order."""
    for quotas in layout.sequence():
        batch = Chunk.concat([streams[c].take(int(q)) for c, q in enumerate(quotas) if q], schema)
        yield batch.take(np.argsort(rng.permutation_keys(seed, STAGE + "/batch", batch.ids), kind="stable"))


@contextlib.contextmanager
def batched(op: Operation, plan: Stratification, data: Dataset, report: ReadReport,
            runtime: Runtime) -> Iterator[Regrouped]:
    """The selection (op's kernel over `data`) in batches of --batch-size, or in balanced batches through a spill
    of one keyed random stream per class (removed when the context closes)."""
    options = plan.options
    size = options.batch_size
    assert size is not None, "stratify regroups only with --batch-size"
    chunks, selected = runtime.apply(op, plan, data, report)
    first, rows = peek(c for c, _ in chunks if c.num_rows)
    expected = None if plan.expected_rows is None else int(plan.expected_rows)
    most_rows = expected if options.mode == "exact" else None if options.replacement else data.num_rows
    budget.check_rows("batch_size", size, most_rows, bytes_per_row(first), options.memory)
    written = Tally()
    """The classes of the batches written (`class_out`) and their layout, counted in order on this side."""

    def stats() -> dict[str, Any]:
        total = Tally()
        total.merge(selected)
        total.merge(written)
        return op.report(plan, total)

    if not options.balanced_batches:
        batches = rebatch(rows, size, data.schema, options.drop_remainder)
        yield Regrouped(_counted(plan, batches, written), emit, stats, expected)
        return
    active = plan.target > 0
    whole = estimate_memory_bytes(data, first, rows=expected)
    part_bytes = max(1, options.memory // (PART_SHARE * int(active.sum())))
    parts = [parts_for(whole * t, part_bytes) for t in plan.target.tolist()]
    with keyed_spill(data.schema, parts, plan.seed, STAGE + "/order", options.memory, options.tmp_dir) as spill:
        with runtime.bar("select", data.progress_rows) as bar:
            spill_streams(rows, spill, plan.labels, bar)
        layout = plan_layout(spill.rows.copy(), plan.target, size, partial=not options.drop_remainder,
                             oversample=False)
        streams = [RowReader(spill.read_group(c), data.schema) for c in range(plan.num_classes)]
        written.latest["batches"] = {"batch_size": size, "balanced_batches": layout.batches + bool(sum(layout.partial)),
                                     "final_batch_quotas": list(layout.partial)}
        batches = balanced_batches(streams, layout, plan.seed, data.schema)
        yield Regrouped(_counted(plan, batches, written), emit, stats, int(layout.per_class.sum()))


def _counted(plan: Stratification, batches: Iterable[Chunk], written: Tally) -> Iterator[Chunk]:
    """The batches as they go to the writer, their classes counted here (on the driver, in order)."""
    for chunk in batches:
        written.add(class_out=np.bincount(plan.labels(chunk), minlength=plan.num_classes))
        yield chunk


__all__ = ["balanced_batches", "batched"]
