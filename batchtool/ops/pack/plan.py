"""pack's first pass and plan: the length histogram, then which lengths share a row (batchtool.ops.pack.packing),
the order of the rows and how they are cut into batches. All of it from counts and the seed, never rows, so
the dry run states exactly what the run writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import budget, rng
from batchtool.io.dataset import Chunk
from batchtool.core.errors import OptionInputError
from batchtool.ops.keyed import range_bytes
from batchtool.ops.pack.options import PackColumns, PackOptions, output_schema
from batchtool.ops.pack.packing import Packing, plan_packing
from batchtool.ops.pack.ranks import RankPlan, assign_ranks
from batchtool.ops.pack.segments import Spans, class_slots
from batchtool.io.padding import default_pad, parse_pad_values
from batchtool.io.stats import add_counts

ROW_STAGE = "pack/row"
"""Keys the permutation from row ids to output positions."""
_BLOCK = 1 << 16
"""Output positions handled per step when laying out batches (keeps that O(batches), not O(rows))."""
PACKED_STEP_BYTES = 40
"""What one padded step of a batch costs beyond its sequence values: segment_ids and positions (at most 4 bytes
each) and the index arrays assembling it (measured: a batch of 1,000,000 padded steps of int64 tokens took 43 MB)."""


# --- first pass: the lengths ----------------------------------------------------------------------------

@dataclass
class LengthCounts:
    """Mergeable first-pass statistics: the histogram of what will be packed, and the input lengths."""

    pieces: np.ndarray
    """pieces[s] = examples (or, with --split-long, pieces) of s steps to pack, s <= max_length (the array
    is as long as the longest piece seen needs)."""
    examples: int = 0
    steps: int = 0
    shortest: int | None = None
    longest: int = 0
    long: int = 0
    """Examples longer than --max-length (split or dropped)."""
    long_steps: int = 0

    def merge(self, other: LengthCounts) -> None:
        self.pieces = add_counts(self.pieces, other.pieces)
        self.examples += other.examples
        self.steps += other.steps
        if other.shortest is not None:
            self.shortest = other.shortest if self.shortest is None else min(self.shortest, other.shortest)
        self.longest = max(self.longest, other.longest)
        self.long += other.long
        self.long_steps += other.long_steps

    def summary(self) -> dict[str, Any]:
        if not self.examples:
            return {"count": 0}
        return {"count": self.examples, "min": self.shortest, "max": self.longest,
                "mean": round(self.steps / self.examples, 3), "total": self.steps,
                "longer_than_max_length": self.long}


def count_lengths(lengths: np.ndarray, options: PackOptions) -> LengthCounts:
    """First-pass statistics of one chunk's lengths (examples over --max-length already checked)."""
    L = options.max_length
    long = lengths[lengths > L]
    pieces = np.bincount(lengths[lengths <= L]).astype(np.int64)
    if options.long == "split" and len(long):
        rest = long % L
        full = np.zeros(L + 1, dtype=np.int64)
        full[L] = int((long // L).sum())
        pieces = add_counts(add_counts(pieces, np.bincount(rest[rest > 0])), full)
    return LengthCounts(pieces, len(lengths), int(lengths.sum()), int(lengths.min()) if len(lengths) else None,
                        int(lengths.max(initial=0)), len(long), int(long.sum()))


def check_long(lengths: np.ndarray, chunk: Chunk, column: str, options: PackOptions,
               locate: Callable[[int], str]) -> None:
    """Without --split-long or --drop-long, an example longer than --max-length stops the run."""
    if options.long != "error":
        return
    long = np.flatnonzero(lengths > options.max_length)
    if len(long):
        i = int(long[0])
        raise OptionInputError("max_length", f"{lengths[i]} steps, more than {{max_length}} {options.max_length} (pass "
                               "{split_long} to cut such examples into pieces, or {drop_long} to drop and count them)",
                               mentions=("split_long", "drop_long"),
                               where=f"{locate(chunk.ids[i])}, column {column!r}: ")


# --- the plan --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackPlan:
    """Everything the passes after the first need: a pure function of options, histogram and seed."""

    options: PackOptions
    columns: PackColumns
    packing: Packing
    report: dict[str, Any]
    lengths: LengthCounts
    seed: int
    pad_values: Mapping[str, Any]
    schema: pa.Schema
    memory: int
    """--memory, which sizes the spill groups and bounds a batch."""
    tasks: int
    """Groups sorted at once (ops.base.Context.tasks): with --memory, what sizes the spill groups."""
    spans: Spans
    """The steps each piece takes in its row (--segment-multiple) and the histogram of them the packing holds."""
    ranks: RankPlan | None = None
    """With --world-size: the (step, rank) of every row (batchtool.ops.pack.ranks); else rows are in keyed order."""

    @property
    def counts(self) -> np.ndarray:
        """Items to pack per length."""
        return self.lengths.pieces

    @property
    def real_steps(self) -> int:
        """Real steps of the rows written: the pieces', less those of the rows --world-size drops (the slots of a
        class's last rows, ops.pack.ranks.kept_rows, read back through the slots' permutation)."""
        ranks, packing = self.ranks, self.packing
        if ranks is None or ranks.dropped_steps == 0 or self.spans.multiple == 1:
            return self.spans.real_steps - (ranks.dropped_steps if ranks else 0)
        dropped = 0
        for c in np.flatnonzero(ranks.class_dropped).tolist():
            rows = int(packing.rows[c])
            for span, slots in class_slots(packing, c, rows - int(ranks.class_dropped[c]), rows):
                dropped += self.spans.real_steps_in(span, slots, self.seed)
        return self.spans.real_steps - dropped

    @property
    def rows(self) -> int:
        """Rows written: the packing's, less the remainder --world-size drops."""
        return self.packing.total_rows - (self.ranks.dropped_rows if self.ranks else 0)

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Output position of each row id (-1: a row of the remainder, dropped)."""
        if self.ranks is not None:
            return self.ranks.position[rows]
        return rng.index_shuffle(self.seed, ROW_STAGE, rows.astype(np.uint64), self.rows).astype(np.int64)

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """The row id at each output position (positions' inverse)."""
        if self.ranks is not None:
            return self.ranks.row_at[positions]
        return rng.index_shuffle(self.seed, ROW_STAGE, positions.astype(np.uint64), self.rows,
                                 inverse=True).astype(np.int64)

    def pad_length(self, widest: int) -> int:
        return self.options.max_length if self.options.pad_to_max_length else widest


def make_plan(options: PackOptions, columns: PackColumns, lengths: LengthCounts, schema: pa.Schema, seed: int,
              memory: int, tasks: int = 1) -> PackPlan:
    """The packing: the best candidate over the histogram of spans; with --world-size, its rows' steps and ranks."""
    spans = Spans.of(lengths.pieces, options.multiple)
    packing, report = plan_packing(spans.counts, options.max_length, options.row_examples)
    pads = parse_pad_values(options.pad_values, schema)
    pad_values = {name: pads.get(name, default_pad(schema.field(name).type)) for name in columns.sequences}
    ranks = None
    if options.world_size is not None:
        assert options.batch_size is not None  # PackOptions: --world-size takes a fixed --batch-size
        ranks = assign_ranks(packing, options.coefficients, options.world_size, options.batch_size, seed)
    return PackPlan(options, columns, packing, report, lengths, seed, pad_values,
                    output_schema(schema, columns, options), memory, tasks, spans, ranks)


@dataclass(frozen=True)
class SpillLayout:
    """Output positions per spill group. A group is loaded whole (memory-mapped, then combined into one copy),
    so its bytes stay within a key range's share of --memory (ops.keyed.range_bytes)."""

    rows_per_group: int
    parts: tuple[int, ...]
    """One spill part per group (the groups are already sized to memory)."""

    @property
    def groups(self) -> int:
        return len(self.parts)


def spill_layout(plan: PackPlan, sizes: tuple[float, float]) -> SpillLayout:
    """Groups of equal output positions under the memory budget; `sizes` = (bytes per example, bytes per
    step) as spilled."""
    per_example, per_step = sizes
    rows, packing = plan.rows, plan.packing
    held = packing.examples * per_example + packing.real_steps * per_step
    most = max(1, int(rows * range_bytes(plan.memory, plan.tasks) / held)) if held else max(1, rows)
    groups = max(1, -(-rows // most))
    per_group = max(1, -(-rows // groups))  # equal groups: a small one would keep its spill buffer's parents alive
    return SpillLayout(per_group, (1,) * groups)


# --- batches: laid out from the plan alone ------------------------------------------------------------------

@dataclass(frozen=True)
class BatchLayout:
    """Per batch, in output order: rows, packed examples, and the longest row (all from the plan)."""

    rows: np.ndarray
    examples: np.ndarray
    widest: np.ndarray

    def padded_steps(self, plan: PackPlan) -> int:
        pad = np.full(len(self.rows), plan.options.max_length) if plan.options.pad_to_max_length else self.widest
        return int((self.rows * pad).sum())


def row_blocks(plan: PackPlan) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first position, real steps, examples) of the rows at consecutive output positions, in blocks."""
    for start in range(0, plan.rows, _BLOCK):
        positions = np.arange(start, min(plan.rows, start + _BLOCK), dtype=np.int64)
        yield (start, *plan.packing.row_shape(plan.rows_at(positions)))


def batch_layout(plan: PackPlan) -> BatchLayout:
    """Cut the rows, in output order, into batches by --batch-size or --max-tokens."""
    pad_to = plan.options.max_length if plan.options.pad_to_max_length else None
    sizes = plan.options.budget.cut((lengths for _, lengths, _ in row_blocks(plan)), pad_to)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    examples = np.zeros(len(sizes), dtype=np.int64)
    widest = np.zeros(len(sizes), dtype=np.int64)
    for first, lengths, counts in row_blocks(plan):
        inside = starts[(starts > first) & (starts < first + len(lengths))] - first
        cuts = np.concatenate([[0], inside]).astype(np.int64)
        batch = np.searchsorted(starts, first, side="right") - 1 + np.arange(len(cuts))
        np.add.at(examples, batch, np.add.reduceat(counts, cuts))
        np.maximum.at(widest, batch, np.maximum.reduceat(lengths, cuts))
    return BatchLayout(sizes, examples, widest)


def check_batches(plan: PackPlan, layout: BatchLayout, sizes: tuple[float, float]) -> None:
    """Stop before the scatter if the largest planned batch would not fit its share of --memory: its rows padded
    to its longest row, or to L with --pad-to-max-length; `sizes` = (bytes per example, bytes per step)."""
    o = plan.options
    if not len(layout.rows):
        return
    per_example, per_step = sizes
    pad = np.full(len(layout.rows), o.max_length) if o.pad_to_max_length else layout.widest
    offsets = 0 if o.max_segments is None else (o.max_segments + 1) * 4 * (1 if o.segment_multiple is None else 2)
    need = layout.rows * (pad * (per_step + PACKED_STEP_BYTES) + offsets) + layout.examples * per_example
    b = int(np.argmax(need))
    field, value = ("batch_size", o.batch_size) if o.batch_size is not None else ("max_tokens", o.max_tokens)
    padding = (f"padded to {{max_length}} {o.max_length:,} steps ({{pad_to_max_length}})" if o.pad_to_max_length
               else f"padded to {int(pad[b]):,} steps")
    fix = f"give a smaller {{{field}}} or {{max_length}}" + (", drop {pad_to_max_length}," if o.pad_to_max_length
                                                            else "") + " or a larger {memory}"
    rows = int(layout.rows[b])
    budget.check_fits(field, f"one batch of {rows:,} row{'s' if rows != 1 else ''} {padding}", float(need[b]),
                      plan.memory, fix,
                      value=value, mentions=("max_length", "pad_to_max_length"))


def planned(plan: PackPlan, layout: BatchLayout) -> dict[str, Any]:
    """What the plan fixes before any row is written: rows, efficiency against the bound, batches."""
    packing = plan.packing
    L = plan.options.max_length
    bound = plan.report["rows_lower_bound"]
    padded = layout.padded_steps(plan)
    ranks = plan.ranks
    real = plan.real_steps
    spanned = packing.real_steps - (ranks.dropped_steps if ranks else 0)  # the packing's steps are the spans'
    segments = ({"segment_padding_steps": spanned - real}
                if plan.options.segment_multiple is not None else {})
    return {
        "max_length": L,
        "rows": plan.rows,
        "rows_lower_bound": bound,
        "proven_optimal": plan.report["proven_optimal"],
        "real_steps": real,
        "packing_efficiency": round(real / (plan.rows * L), 6) if plan.rows else None,
        "packing_efficiency_bound": round(plan.spans.real_steps / (bound * L), 6) if bound else None,
        "method": plan.report["method"],
        "candidates": plan.report["candidates"],
        "examples_per_row": packing.examples_per_row(),
        "batches": len(layout.rows),
        "padded_steps": padded,
        "padding_efficiency": round(real / padded, 6) if padded else None,
        **segments,
        **(ranks.report(plan.options.balance or "attention", plan.options.coefficients) if ranks else {}),
    }


__all__ = ["BatchLayout", "LengthCounts", "PACKED_STEP_BYTES", "PackPlan", "ROW_STAGE", "SpillLayout", "batch_layout",
           "check_batches", "check_long", "count_lengths", "make_plan", "planned", "row_blocks", "spill_layout"]
