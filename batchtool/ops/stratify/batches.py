"""stratify with --batch-size: its selected rows cut into batches, or spilled by class and dealt out as balanced
batches (each batch its exact share of every class); stratify's regrouping (Operation.regroup)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from batchtool.core import budget
from batchtool.io.dataset import Chunk, ReadReport
from batchtool.ops.base import Operation
from batchtool.ops.regroup import Cut, Exchange, Input, Probe, Regrouped, Runtime, Scatter, Scattered
from batchtool.core.tally import Tally
from batchtool.ops.keyed import flush_bytes, range_bytes
from batchtool.ops.quotas import QuotaBatches, QuotaLayout, plan_layout
from batchtool.ops.rows import Yardstick, bytes_per_row, emit_batch, estimate_bytes, peek, rebatch
from batchtool.ops.stratify.plans import STAGE, Stratification
from batchtool.io.spill import parts_for

ORDER_STAGE, BATCH_STAGE = STAGE + "/order", STAGE + "/batch"
"""The keyed orders of each class's rows, and of the rows within a balanced batch."""


@contextlib.contextmanager
def batched(op: Operation, plan: Stratification, input: Input, runtime: Runtime,
            report: ReadReport) -> Iterator[Regrouped]:
    """The selection (op's kernel over the input) in batches of --batch-size, as it streams (balanced batches run as
    the exchange below)."""
    options = plan.options
    size = options.batch_size
    assert size is not None and not options.balanced_batches, "stratify streams plain batches only"
    chunks, selected = runtime.apply(op, plan, report)
    first, rows = peek(c for c, _ in chunks if c.num_rows)
    expected = _check_memory(plan, input, Yardstick.of(first))
    written = Tally()
    """The classes of the batches written (`class_out`), counted in order on this side."""
    batches = rebatch(rows, size, input.schema, options.drop_remainder)
    yield Regrouped(_counted(plan, batches, written), emit_batch, functools.partial(written_stats, op, plan, selected, written),
                    expected)


def written_stats(op: Operation, plan: Stratification, selected: Tally, written: Tally) -> dict[str, Any]:
    """The manifest's statistics: the selection's and the written batches' counts."""
    total = Tally()
    total.merge(selected)
    total.merge(written)
    return op.report(plan, total)


def _check_memory(plan: Stratification, input: Input, first: Yardstick | None) -> int | None:
    """Stop before spilling if one batch would not fit --memory (rows sized from the selection's first non-empty
    chunk); the rows the plan expects, if it fixes them."""
    options = plan.options
    assert options.batch_size is not None
    expected = None if plan.expected_rows is None else int(plan.expected_rows)
    most_rows = expected if options.mode == "exact" else None if options.replacement else input.num_rows
    budget.check_rows("batch_size", options.batch_size, most_rows, bytes_per_row(first), plan.memory)
    return expected


def _class_parts(plan: Stratification, input: Input, first: Yardstick | None, expected: int | None) -> list[int]:
    """Spill parts of each class's stream, from the selection's size (its first non-empty chunk's bytes per row)."""
    active = plan.target > 0
    whole = estimate_bytes(input, first, rows=expected)
    part_bytes = max(1, range_bytes(plan.memory, plan.tasks) // int(active.sum()))
    return [parts_for(whole * t, part_bytes) for t in plan.target.tolist()]


def _layout(plan: Stratification, spilled: np.ndarray) -> QuotaLayout:
    """The balanced batches the rows spilled per class make."""
    return plan_layout(spilled.copy(), plan.target, plan.options.batch_size, partial=not plan.options.drop_remainder,
                       oversample=False)


def record_layout(layout: QuotaLayout, written: Tally) -> None:
    written.latest["batches"] = {"batch_size": layout.batch_size,
                                 "balanced_batches": layout.batches + bool(sum(layout.partial)),
                                 "final_batch_quotas": list(layout.partial)}


# -- --balanced-batches as an exchange (Operation.regroup) --------------------------------------------------------


def exchange(op: Operation, plan: Stratification, input: Input, probe: Probe) -> Exchange | None:
    """The balanced batches as map-reduce: map tasks select their rows (the kernel) and scatter them to their
    class's key ranges, reduce tasks sort each range, and the batches are cut where they are written, from the
    classes' counts alone. With --mode online, whose chunk plans depend on the chunks before, the selection runs
    in input order on the driver (its kernels on the runtime) and is scattered there. None without
    --balanced-batches."""
    options = plan.options
    if not options.balanced_batches:
        return None
    per_chunk = op.per_chunk(plan)
    if per_chunk is None:
        first = probe(functools.partial(selected_size, op, plan))
    else:  # the yardstick of the first chunk the online selection keeps rows of, its plans made in order
        first = probe(functools.partial(_planned_size, op, per_chunk), in_order=True)
    expected = _check_memory(plan, input, first)
    parts = _class_parts(plan, input, first, expected)
    scatter = Scatter(input.schema, tuple(parts), plan.seed, ORDER_STAGE,
                      flush_bytes(plan.memory, sum(parts), plan.tasks),
                      None if per_chunk is not None else functools.partial(selected_rows, op, plan))
    rows = None if per_chunk is None else functools.partial(_online_rows, op, plan)
    return Exchange(scatter, functools.partial(_exchange_cut, op, plan), rows)


def _planned_size(op: Operation, per_chunk: Callable[[Chunk], Stratification], chunk: Chunk) -> Yardstick | None:
    return selected_size(op, per_chunk(chunk), chunk)


def _selected_planned(op: Operation, planned: tuple[Chunk, Stratification]) -> tuple[Chunk, np.ndarray, Tally]:
    chunk, chunk_plan = planned
    return selected_rows(op, chunk_plan, chunk)


def _online_rows(op: Operation, plan: Stratification, runtime: Runtime,
                 report: ReadReport) -> Iterator[tuple[Chunk, np.ndarray, Tally]]:
    """--mode online: each chunk's selection with its plan made in input order (the kernels on the runtime)."""
    per_chunk = op.per_chunk(plan)
    assert per_chunk is not None
    planned = ((chunk, per_chunk(chunk)) for chunk in runtime.rows(None, report))
    yield from runtime.executor.map(functools.partial(_selected_planned, op), planned)


def selected_rows(op: Operation, plan: Stratification, chunk: Chunk) -> tuple[Chunk, np.ndarray, Tally]:
    """A map task's chunk: the rows the kernel selects (copies built), their classes, the kernel's counts."""
    copies, tally = op.kernel(plan, chunk)
    rows = copies.rows()
    return rows, plan.labels(rows), tally


def selected_size(op: Operation, plan: Stratification, chunk: Chunk) -> Yardstick | None:
    rows = selected_rows(op, plan, chunk)[0]
    return Yardstick.of(rows) if rows.num_rows else None


def _exchange_cut(op: Operation, plan: Stratification, scattered: Scattered, runtime: Runtime) -> Cut:
    """The layout from the rows each class got, and the batches' classes from their quotas (a balanced batch
    takes exactly its quota from each class), counted as `batched` counts them."""
    selected, written = Tally(), Tally()
    for tally in scattered.stats:
        selected.merge(tally)
    layout = _layout(plan, scattered.rows)
    quotas = np.array(list(layout.sequence()), dtype=np.int64).reshape(-1, plan.num_classes)
    if len(quotas):
        written.add(class_out=quotas.sum(axis=0))
    record_layout(layout, written)
    batches = QuotaBatches(scattered.groups, quotas, plan.seed, BATCH_STAGE, scattered.schema)
    return Cut(batches, functools.partial(written_stats, op, plan, selected, written))


def _counted(plan: Stratification, batches: Iterable[Chunk], written: Tally) -> Iterator[Chunk]:
    """The batches as they go to the writer, their classes counted here (on the driver, in order)."""
    for chunk in batches:
        written.add(class_out=np.bincount(plan.labels(chunk), minlength=plan.num_classes))
        yield chunk


__all__ = ["ORDER_STAGE", "BATCH_STAGE", "batched", "exchange", "record_layout", "written_stats", "selected_rows", "selected_size"]
