"""`pack`: whole sequences packed into rows of at most --max-length steps, planned once over the length
histogram, assembled through a spill in bounded memory, with the segment ids varlen attention needs.

Passes: (1) the lengths alone, into a histogram of the pieces to pack; the plan (which lengths share a
row) is made from it by batchtool.ops.packing. (2) Every example is given a slot of its length: its
arrival rank among examples of that length, through a keyed permutation, so which examples share a row
is random among examples of the same length; the slot's row goes through a second keyed permutation to
its output position, and the example is spilled to the group of output positions it belongs to. (3)
Groups are read back in order, sorted by position (and a keyed order within the row), cut into batches
and assembled into packed rows on worker threads. Every decision is a pure function of --seed, the
histogram and the input order, so output bytes do not depend on --threads, --memory or the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool import progress, rng
from batchtool.dataset import Chunk, Dataset, ReadReport, open_dataset
from batchtool.engines import with_engine
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.job import JobResult, RunSettings, write_job
from batchtool.ops.bucket_batches import take_sizes
from batchtool.ops.bucket_plan import BatchBudget, flush_bytes, row_bytes
from batchtool.ops.packing import Packing, plan_packing
from batchtool.output import OutputOptions
from batchtool.padding import default_pad, pad_list_column, parse_pad_values, row_lengths, sequence_lengths
from batchtool.runner import ordered_map
from batchtool.spill import Spill
from batchtool.stats import _add_counts, is_sequence_type

LONG = ("error", "split", "drop")
"""What happens to an example longer than --max-length: stop the run, cut it into pieces, drop it."""
PER_STEP = ("segment_ids", "positions")
PER_ROW = ("cu_seqlens", "num_examples", "length", "batch")
SOURCE_OFFSET = "source_offset"
"""With --split-long: per packed example, the step of its source example where the piece starts."""
MAX_LENGTH_LIMIT = 1 << 22
"""--max-length at most this (4M steps): planning holds counts per length up to max_length, 8 bytes each."""
MAX_PADDED_STEPS = (1 << 31) - 1
SLOT_STAGE, ROW_STAGE, ORDER_STAGE, SPILL_STAGE = "pack/slot", "pack/row", "pack/order", "pack/spill"
_POS, _ORDER = "__batchtool_pos", "__batchtool_order"
_BLOCK = 1 << 16
"""Output positions handled per step when laying out batches (keeps that O(batches), not O(rows))."""
_TAKE = 4096
"""Examples taken at a time from a sorted spill group (so the group is never copied whole)."""


@dataclass(frozen=True)
class PackOptions:
    """What `pack` computes; validated on construction (flags named as on the command line)."""

    max_length: int
    sequences: tuple[str, ...] = ()
    max_examples_per_row: int | None = None
    long: str = "error"
    batch_size: int | None = None
    max_tokens: int | None = None
    pad_to_max_length: bool = False
    pad_values: tuple[str, ...] = ()
    memory: int = 1 << 30
    tmp_dir: str | None = None

    def __post_init__(self) -> None:
        L = self.max_length
        if not 1 <= L <= MAX_LENGTH_LIMIT:
            raise UsageError(f"--max-length {L}: must be between 1 and {MAX_LENGTH_LIMIT:,}")
        K = self.max_examples_per_row
        if K is not None and K < 1:
            raise UsageError(f"--max-examples-per-row {K}: must be at least 1")
        if self.long not in LONG:
            raise UsageError(f"long examples: {self.long!r} is not one of {', '.join(LONG)}")
        if (self.batch_size is None) == (self.max_tokens is None):
            raise UsageError("give exactly one of --batch-size and --max-tokens")
        if self.batch_size is not None:
            if self.batch_size < 1:
                raise UsageError(f"--batch-size {self.batch_size}: must be positive")
            if self.pad_to_max_length and self.batch_size * L > MAX_PADDED_STEPS:
                raise UsageError(f"--batch-size {self.batch_size} x --max-length {L} padded steps exceed "
                                 f"{MAX_PADDED_STEPS:,} (the most an Arrow list column holds); use a smaller batch")
        if self.max_tokens is not None and not L <= self.max_tokens <= MAX_PADDED_STEPS:
            raise UsageError(f"--max-tokens {self.max_tokens}: must be between --max-length ({L}, so that a "
                             f"full row fits) and {MAX_PADDED_STEPS:,}")
        if self.memory <= 0:
            raise UsageError(f"--memory {self.memory}: must be positive")

    @property
    def budget(self) -> BatchBudget:
        return BatchBudget(batch_size=self.batch_size, max_tokens=self.max_tokens)


@dataclass(frozen=True)
class PackColumns:
    """Which input columns play which part; resolved from the schema before the first pass."""

    sequences: tuple[str, ...]
    """List columns concatenated into packed rows; they must agree in length row by row."""
    others: tuple[str, ...]
    """Every other column, written as a list of one value per packed example."""
    defaulted: bool = False

    @property
    def length(self) -> str:
        return self.sequences[0]


def resolve_columns(options: PackOptions, schema: pa.Schema) -> PackColumns:
    """Check the named sequence columns (default: every list column) and that no input column is named
    like an output column."""
    names = schema.names
    for name in options.sequences:
        if name not in names:
            raise SchemaError(f"--sequence {name}: no such column (available: {', '.join(names)})")
        if not is_sequence_type(schema.field(name).type):
            raise SchemaError(f"--sequence {name}: column is {schema.field(name).type}, expected a list "
                              "(sequence) column")
    sequences = options.sequences or tuple(f.name for f in schema if is_sequence_type(f.type))
    if not sequences:
        raise SchemaError("no list column to pack: pass --sequence COL")
    added = [*PER_STEP, *PER_ROW, *([SOURCE_OFFSET] if options.long == "split" else [])]
    clash = [c for c in added if c in names]
    if clash:
        raise SchemaError(f"column {clash[0]!r} is also an output column of pack ({', '.join(added)}); "
                          "rename it first (e.g. a rename stage of `batchtool run`)")
    unpadded = sorted(set(parse_pad_values(options.pad_values, schema)) - set(sequences))
    if unpadded:
        raise UsageError(f"--pad-value {unpadded[0]}=...: column {unpadded[0]!r} is not packed "
                         f"(sequence columns: {', '.join(sequences)})")
    return PackColumns(tuple(sequences), tuple(n for n in names if n not in sequences),
                       defaulted=not options.sequences)


def output_schema(schema: pa.Schema, columns: PackColumns, options: PackOptions) -> pa.Schema:
    """Input columns in their order (sequences packed, the others as per-example lists), then the
    packing columns."""
    fields = [pa.field(f.name, pa.list_(f.type.value_field)) if f.name in columns.sequences
              else pa.field(f.name, pa.list_(f.type)) for f in schema]
    if options.long == "split":
        fields.append(pa.field(SOURCE_OFFSET, pa.list_(pa.int32())))
    fields += [pa.field(name, pa.list_(pa.int32())) for name in (*PER_STEP, "cu_seqlens")]
    fields += [pa.field("num_examples", pa.int32()), pa.field("length", pa.int32()), pa.field("batch", pa.int64())]
    return pa.schema(fields)


def feature_lists(schema: pa.Schema, columns: PackColumns) -> tuple[str, ...]:
    """Columns written as SequenceExample feature lists: the per-step ones, and per-example lists of lists
    (which a context feature cannot hold); the other per-example and per-row lists are context features."""
    nested = tuple(f.name for f in schema if f.name in columns.others and is_sequence_type(f.type.value_type))
    return (*columns.sequences, *PER_STEP, *nested)


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
        self.pieces = _add_counts(self.pieces, other.pieces)
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
        pieces = _add_counts(_add_counts(pieces, np.bincount(rest[rest > 0])), full)
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
        raise InputError(f"{locate(chunk.ids[i])}, column {column!r}: {lengths[i]} steps, more than --max-length "
                         f"{options.max_length} (pass --split-long to cut such examples into pieces, or "
                         "--drop-long to drop and count them)")


def first_pass(dataset: Dataset, columns: PackColumns, options: PackOptions, run: RunSettings) -> LengthCounts:
    """The length histogram, reading only the first sequence column."""
    def part(task: Callable[[], Chunk]) -> LengthCounts:
        chunk = task()
        lengths = row_lengths(chunk.data.column(columns.length))
        check_long(lengths, chunk, columns.length, options, dataset.locate)
        return count_lengths(lengths, options)

    total = LengthCounts(np.zeros(0, dtype=np.int64))
    with progress.bar("pack: lengths", dataset.num_rows, quiet=run.quiet) as bar:
        for counts in ordered_map(part, dataset.tasks([columns.length], ReadReport()), run.threads):
            total.merge(counts)
            bar.update(counts.examples)
    return total


# --- the plan --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackPlan:
    """Everything the passes after the first need: a pure function of options, histogram and seed."""

    options: PackOptions
    columns: PackColumns
    packing: Packing
    report: dict[str, Any]
    counts: np.ndarray
    seed: int
    pad_values: Mapping[str, Any]
    schema: pa.Schema
    rows_per_group: int
    """Output positions per spill group. A group is loaded whole (memory-mapped, then combined into one
    copy), so its bytes stay under a quarter of --memory; the spill's write buffers take another quarter."""
    parts: tuple[int, ...] = field(default=())
    """One spill part per group (the groups are already sized to memory)."""

    @property
    def rows(self) -> int:
        return self.packing.total_rows

    @property
    def groups(self) -> int:
        return len(self.parts)

    def pad_length(self, widest: int) -> int:
        return self.options.max_length if self.options.pad_to_max_length else widest


def make_plan(options: PackOptions, columns: PackColumns, counts: LengthCounts, schema: pa.Schema, seed: int,
              sizes: tuple[float, float]) -> PackPlan:
    """The packing (the best candidate over the histogram) and the spill layout; `sizes` = (bytes per
    example, bytes per step) as spilled."""
    packing, report = plan_packing(counts.pieces, options.max_length, options.max_examples_per_row)
    per_example, per_step = sizes
    rows = packing.total_rows
    held = packing.examples * per_example + packing.real_steps * per_step
    most = max(1, int(rows * (options.memory // 4) / held)) if held else max(1, rows)
    groups = max(1, -(-rows // most))
    per_group = max(1, -(-rows // groups))  # equal groups: a small one would keep its spill buffer's parents alive
    pads = parse_pad_values(options.pad_values, schema)
    pad_values = {name: pads.get(name, default_pad(schema.field(name).type)) for name in columns.sequences}
    return PackPlan(options, columns, packing, report, counts.pieces, seed, pad_values,
                    output_schema(schema, columns, options), per_group, (1,) * groups)


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
        positions = np.arange(start, min(plan.rows, start + _BLOCK), dtype=np.uint64)
        row_ids = rng.index_shuffle(plan.seed, ROW_STAGE, positions, plan.rows, inverse=True)
        yield (start, *plan.packing.row_shape(row_ids.astype(np.int64)))


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


# --- second pass: pieces, slots, positions, spill ---------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """One input chunk as items to pack (examples, or pieces of them), with what was dropped or split."""

    items: Chunk
    lengths: np.ndarray
    rows_in: int
    dropped: int
    split: int


def prepare(chunk: Chunk, plan: PackPlan, locate: Callable[[int], str]) -> Prepared:
    """Measure, check, drop or split one chunk, and normalise its sequence columns to plain lists;
    a pure function run on worker threads."""
    o, cols = plan.options, plan.columns

    def at(i: int) -> str:
        return locate(chunk.ids[i])

    try:
        lengths = sequence_lengths(chunk.data, cols.sequences, at)
    except SchemaError as exc:
        hint = "; pass --sequence to choose the columns to pack" if cols.defaulted else ""
        raise SchemaError(f"{exc}{hint}") from exc
    check_long(lengths, chunk, cols.length, o, locate)
    rows_in, dropped = chunk.num_rows, 0
    long = lengths > o.max_length
    if o.long == "drop" and long.any():
        chunk, lengths, dropped = chunk.filter(~long), lengths[~long], int(long.sum())
    data = chunk.data
    source = np.arange(len(lengths))
    pieces = lengths
    offsets = np.zeros(len(lengths), dtype=np.int64)
    if o.long == "split":
        count = np.maximum(1, -(-lengths // o.max_length))
        source = np.repeat(source, count)
        offsets = (np.arange(len(source)) - np.repeat(np.cumsum(count) - count, count)) * o.max_length
        pieces = np.minimum(lengths[source] - offsets, o.max_length)
        data = data.take(pa.array(source)) if len(source) != len(lengths) else data
    bounds = pa.array(np.concatenate([[0], np.cumsum(pieces)]).astype(np.int32))
    arrays = [pa.ListArray.from_arrays(bounds, chunk.data.column(f.name).flatten(), type=pa.list_(f.type.value_field))
              if f.name in cols.sequences else data.column(f.name) for f in chunk.data.schema]
    names = list(chunk.data.schema.names)
    if o.long == "split":
        arrays.append(pa.array(offsets.astype(np.int32)))
        names.append(SOURCE_OFFSET)
    items = Chunk(pa.RecordBatch.from_arrays(arrays, names=names), chunk.ids[source])
    return Prepared(items, pieces.astype(np.int64), rows_in, dropped, int(long.sum()) if o.long == "split" else 0)


@dataclass
class Tally:
    """What the second pass read, dropped and split; filled by the one thread that spills."""

    rows_in: int = 0
    dropped: int = 0
    split: int = 0
    items: int = 0


class Slots:
    """Gives each item, in input order, its row: the n-th item of length s takes slot perm_s(n) of the
    slots of length s (a keyed permutation per length), and that slot's row comes from the plan."""

    def __init__(self, plan: PackPlan) -> None:
        self.plan = plan
        self.seen = np.zeros(len(plan.counts), dtype=np.int64)

    def rows(self, lengths: np.ndarray, locate: Callable[[int], str], ids: np.ndarray) -> np.ndarray:
        order = np.argsort(lengths, kind="stable")
        ordered = lengths[order]
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        within = np.arange(len(ordered)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(ordered)]])))
        rank = np.empty(len(lengths), dtype=np.int64)
        rank[order] = self.seen[ordered] + within
        self.seen += np.bincount(lengths, minlength=len(self.seen))
        total = self.plan.counts[lengths]
        over = np.flatnonzero(rank >= total)
        if len(over):
            raise InputError(f"{locate(ids[over[0]])}: the input changed while it was read (more examples of "
                             f"{lengths[over[0]]} steps than the first pass counted)")
        slots = rng.index_shuffle(self.plan.seed, SLOT_STAGE, rank.astype(np.uint64), total, tweak=lengths)
        return self.plan.packing.rows_of(lengths, slots.astype(np.int64))


def spill_schema(schema: pa.Schema, plan: PackPlan) -> pa.Schema:
    """What is spilled per item: the input columns (sequences as plain lists), the piece's offset with
    --split-long, its output position and its order within the row."""
    fields = [pa.field(f.name, pa.list_(f.type.value_field)) if f.name in plan.columns.sequences else f
              for f in schema]
    if plan.options.long == "split":
        fields.append(pa.field(SOURCE_OFFSET, pa.int32()))
    fields += [pa.field(_POS, pa.int64()), pa.field(_ORDER, pa.uint64())]
    return pa.schema(fields)


def scatter(dataset: Dataset, plan: PackPlan, spill: Spill, tally: Tally, run: RunSettings,
            report: ReadReport) -> None:
    """The second pass: every item to the spill group of its output position, in input order (so the
    ranks, and everything after them, are the same for any --threads)."""
    slots = Slots(plan)
    with progress.bar("pack: scatter", dataset.num_rows, quiet=run.quiet) as bar:
        for p in ordered_map(lambda task: prepare(task(), plan, dataset.locate), dataset.tasks(None, report),
                             run.threads):
            tally.rows_in += p.rows_in
            tally.dropped += p.dropped
            tally.split += p.split
            tally.items += len(p.lengths)
            bar.update(p.rows_in)
            if not len(p.lengths):
                continue
            row_ids = slots.rows(p.lengths, dataset.locate, p.items.ids)
            position = rng.index_shuffle(plan.seed, ROW_STAGE, row_ids.astype(np.uint64), plan.rows).astype(np.int64)
            order = rng.keyed_hash(plan.seed, ORDER_STAGE, p.items.ids)
            data = p.items.data.append_column(_POS, pa.array(position)).append_column(_ORDER, pa.array(order))
            spill.add(Chunk(data, p.items.ids), position // plan.rows_per_group)
    spill.finish()


def sorted_items(spill: Spill, plan: PackPlan) -> Iterator[Chunk]:
    """All items in output order: group by group, sorted by (position, keyed order within the row),
    taken a slice at a time so a group is never copied whole."""
    for group in range(plan.groups):
        for chunk in spill.read_group(group):
            order = np.lexsort((chunk.data.column(_ORDER).to_numpy(), chunk.data.column(_POS).to_numpy()))
            for start in range(0, len(order), _TAKE):
                yield chunk.take(order[start:start + _TAKE])
            del chunk  # before the next group is read


# --- assembling packed rows (pure, on worker threads) -----------------------------------------------------

@dataclass(frozen=True)
class BatchItem:
    """One batch on its way to a worker: its index, its items in row order, its padded length."""

    index: int
    items: Chunk
    pad_length: int


def assemble(items: pa.RecordBatch, rows: np.ndarray, batch: int, pad_length: int, schema: pa.Schema,
             sequences: Sequence[str], pad_values: Mapping[str, Any]) -> pa.RecordBatch:
    """Packed rows of `schema` from items in row order (`rows`: each item's row, non-decreasing): the
    sequence columns concatenated and padded to `pad_length`, segment_ids and positions per step,
    cu_seqlens, num_examples and length per row, every other column as a list per row."""
    lengths = row_lengths(items.column(sequences[0]))
    n = len(lengths)
    starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if n else np.zeros(0, np.int64)
    count = len(starts)
    per_row = np.diff(np.concatenate([starts, [n]]))
    row = np.repeat(np.arange(count), per_row)
    first_step = np.cumsum(lengths) - lengths
    offset = first_step - first_step[starts][row]
    row_steps = np.add.reduceat(lengths, starts) if n else np.zeros(0, np.int64)
    step_item = np.repeat(np.arange(n), lengths)
    step = np.arange(len(step_item)) - first_step[step_item]
    dest = row[step_item] * pad_length + offset[step_item] + step
    padded = pa.array((np.arange(count + 1) * pad_length).astype(np.int32))

    def per_step(values: np.ndarray) -> pa.Array:
        out = np.zeros(count * pad_length, dtype=np.int32)
        out[dest] = values
        return pa.ListArray.from_arrays(padded, pa.array(out))

    cu = np.zeros(n + count, dtype=np.int32)
    cu[np.arange(n) + row + 1] = offset + lengths
    computed = {
        "segment_ids": lambda: per_step((np.arange(n) - starts[row] + 1)[step_item]),
        "positions": lambda: per_step(step),
        "cu_seqlens": lambda: pa.ListArray.from_arrays(
            pa.array(np.concatenate([starts + np.arange(count), [n + count]]).astype(np.int32)), pa.array(cu)),
        "num_examples": lambda: pa.array(per_row.astype(np.int32)),
        "length": lambda: pa.array(row_steps.astype(np.int32)),
        "batch": lambda: pa.array(np.full(count, batch, dtype=np.int64)),
    }
    example_bounds = pa.array(np.concatenate([starts, [n]]).astype(np.int32))
    row_bounds = pa.array(np.concatenate([[0], np.cumsum(row_steps)]).astype(np.int32))
    arrays = []
    for f in schema:
        if f.name in sequences:
            packed = pa.ListArray.from_arrays(row_bounds, items.column(f.name).flatten(), type=f.type)
            arrays.append(pad_list_column(packed, pad_length, pad_values[f.name]))
        elif f.name in computed:
            arrays.append(computed[f.name]())
        else:
            arrays.append(pa.ListArray.from_arrays(example_bounds, items.column(f.name), type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def batches(spill: Spill, plan: PackPlan, layout: BatchLayout, schema: pa.Schema) -> Iterator[BatchItem]:
    for index, items in enumerate(take_sizes(sorted_items(spill, plan), layout.examples.tolist(), schema)):
        yield BatchItem(index, items, plan.pad_length(int(layout.widest[index])))


def consumed(items: Chunk, plan: PackPlan) -> int:
    """Input examples a batch finishes: every item, or with --split-long only first pieces."""
    if plan.options.long != "split":
        return items.num_rows
    return int((items.data.column(SOURCE_OFFSET).to_numpy() == 0).sum())


# --- statistics and the command -----------------------------------------------------------------------

def expected(plan: PackPlan, layout: BatchLayout) -> dict[str, Any]:
    """What the plan fixes before any row is written: rows, efficiency against the bound, batches."""
    packing = plan.packing
    L = plan.options.max_length
    bound = plan.report["rows_lower_bound"]
    padded = layout.padded_steps(plan)
    return {
        "max_length": L,
        "rows": packing.total_rows,
        "rows_lower_bound": bound,
        "proven_optimal": plan.report["proven_optimal"],
        "real_steps": packing.real_steps,
        "packing_efficiency": packing.efficiency(),
        "packing_efficiency_bound": round(packing.real_steps / (bound * L), 6) if bound else None,
        "method": plan.report["method"],
        "candidates": plan.report["candidates"],
        "examples_per_row": packing.examples_per_row(),
        "batches": len(layout.rows),
        "padded_steps": padded,
        "padding_efficiency": round(packing.real_steps / padded, 6) if padded else None,
    }


def pack_stats(plan: PackPlan, layout: BatchLayout, counts: LengthCounts, tally: Tally) -> dict[str, Any]:
    """manifest["stats"]: what was read, dropped and split, then the packing and its efficiency."""
    out: dict[str, Any] = {"rows_in": tally.rows_in, "lengths_in": counts.summary(),
                           "examples_dropped": {"long": tally.dropped}, "examples_split": tally.split,
                           "examples_packed": tally.items}
    return {**out, **expected(plan, layout)}


@with_engine
def pack(src: str, dst: str, options: PackOptions, output: OutputOptions, run: RunSettings = RunSettings(),
         *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """First pass (lengths) -> plan -> scatter items to spill groups by output position -> packed rows in
    batches, padded, in a seeded random row order -> batch shards + manifest."""
    dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt)
    columns = resolve_columns(options, dataset.schema)
    return write_packed(dataset, options, columns, first_pass(dataset, columns, options, run), dst, output, run,
                        seed=seed)


def plan_for(dataset: Dataset, options: PackOptions, columns: PackColumns, counts: LengthCounts,
             seed: int) -> PackPlan:
    """The plan, with the spill sized on a sample chunk's bytes."""
    sample = next(iter(dataset.tasks()), None)
    return make_plan(options, columns, counts, dataset.schema, seed,
                     row_bytes(sample().data if sample else None, columns))  # type: ignore[arg-type]


def write_packed(dataset: Dataset, options: PackOptions, columns: PackColumns, counts: LengthCounts, dst: str,
                 output: OutputOptions, run: RunSettings, *, seed: int,
                 write: Callable[..., JobResult] = write_job) -> JobResult:
    """Everything after the first pass (`write` is write_job, or a wrapper when pack ends a pipeline)."""
    plan = plan_for(dataset, options, columns, counts, seed)
    layout = batch_layout(plan)
    report = ReadReport()
    tally = Tally()
    schema = spill_schema(dataset.schema, plan)
    with Spill(schema, plan.parts, seed, SPILL_STAGE, options.tmp_dir, flush_bytes(plan, options.memory)) as spill:
        scatter(dataset, plan, spill, tally, run, report)
        return write(
            command="pack", options=_manifest_options(options), seed=seed, dataset=dataset, dst=dst,
            output=_output(output, plan), schema=plan.schema,
            items=batches(spill, plan, layout, schema),
            work=lambda item: ([assemble(item.items.data, item.items.data.column(_POS).to_numpy(), item.index,
                                         item.pad_length, plan.schema, plan.columns.sequences, plan.pad_values)],
                               consumed(item.items, plan)),
            stats=lambda: pack_stats(plan, layout, counts, tally), run=run, report=report,
            total_rows=counts.examples - (counts.long if options.long == "drop" else 0), desc="pack: write")


def _output(output: OutputOptions, plan: PackPlan) -> OutputOptions:
    """Which columns are feature lists, should the output be SequenceExample records."""
    return replace(output, sequence_columns=feature_lists(plan.schema, plan.columns))


def _manifest_options(options: PackOptions) -> dict[str, Any]:
    out = asdict(options)
    out.pop("tmp_dir")
    return out
