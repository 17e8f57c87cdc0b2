"""`pack`: whole sequences packed into rows of at most --max-length steps, planned once over the length
histogram, assembled through a spill in bounded memory, with the segment ids varlen attention needs.

Passes: (1) the lengths alone, into a histogram of the pieces to pack; the plan (which lengths share a
row) is made from it by batchtool.ops.pack.packing (ops/pack/plan.py). (2) Every example is given a slot of its
length (with --segment-multiple, of its span: ops/pack/segments.py): its arrival rank among examples of that
length, through a keyed permutation, so which examples share a row is random among examples of the same length;
the slot's row goes through a second keyed permutation to its output position, and the example is scattered to
the group of output positions it belongs to. (3) Each group is sorted by position (and a keyed order within the
row) on a worker, and the planned batches are assembled into packed rows where they are written
(ops/pack/rows.py). Every decision is a pure function of --seed, the histogram and the input order, so output
bytes do not depend on --threads, --memory or the engine.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from batchtool.ops import names as own
from batchtool.ops.base import Context, Declared, Kind, Operation, OutputRows, Pass, Said
from batchtool.ops.pack.options import (DEFAULT_BATCH_SIZE, PackColumns, PackOptions, output_schema,
                                        resolve_columns)

if TYPE_CHECKING:  # the kernels are imported where the op runs: `pack --help` imports no arrays
    import pyarrow as pa

    from batchtool.io.dataset import Chunk
    from batchtool.ops.pack.plan import LengthCounts, PackPlan
    from batchtool.ops.regroup import Exchange, Input, Probe
    from batchtool.io.output import OutputOptions


def _no_lengths() -> LengthCounts:
    import numpy as np

    from batchtool.ops.pack.plan import LengthCounts

    return LengthCounts(np.zeros(0, dtype=np.int64))


def _lengths(options: PackOptions, context: Context, chunk: Chunk) -> LengthCounts:
    from batchtool.io.padding import row_lengths
    from batchtool.ops.pack.plan import check_long, count_lengths

    columns = resolve_columns(options, context.schema)
    lengths = row_lengths(chunk.data.column(columns.length))
    for role, column in columns.adopted.items():
        own.check_adopted(chunk, column, lengths, context.locate, "pack", role, "the example has {} steps")
    check_long(lengths, chunk, columns.length, options, context.locate)
    return count_lengths(lengths, options)


DECLARED = Declared(
    "pack",
    summary=f"""Pack whole sequences into rows of at most L steps, for transformer training without padding waste.

    Which lengths share a row is planned once over the whole length histogram (near the optimum,
    which the summary states); which examples fill those rows, and the order of the rows, are seeded
    random. DST gets the packed sequence columns with segment_ids and positions per step (in the smallest
    integer type that holds L), cu_seqlens, num_examples and length per row (--output-column names them
    otherwise), and every other column (or those --columns names) as a list of one value per example (an integer
    column named like pack's `length` is taken for it if it holds each example's steps). A batch holds
    {DEFAULT_BATCH_SIZE} rows unless --batch-size or --max-tokens says otherwise.""",
    example="batchtool pack sample_data/parquet /tmp/packed --max-length 512 --sequence tokens --columns key,label",
    options=PackOptions,
    kind=Kind.BATCHES,
    seeded=True,
    spills=("memory",),
    batches_flag=True,
    output_rows=OutputRows.PACKED)


class Pack(Operation[PackOptions, "PackPlan"], declared=DECLARED):
    def output_schema(self, options: PackOptions, schema: pa.Schema) -> pa.Schema:
        return output_schema(schema, resolve_columns(options, schema), options)

    def recorded(self, options: PackOptions, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        return options.recorded()

    def first_pass(self, options: PackOptions, schema: pa.Schema) -> Pass:
        """The lengths alone: the first sequence column (and an input column pack adopts, checked against them)."""
        columns = resolve_columns(options, schema)
        return Pass([columns.length, *columns.dropped], _no_lengths, functools.partial(_lengths, options),
                    desc="lengths")

    def plan(self, options: PackOptions, context: Context, stats: LengthCounts | None) -> PackPlan:
        from batchtool.ops.pack.plan import make_plan

        assert stats is not None  # pack always has its first pass
        return make_plan(options, resolve_columns(options, context.schema), stats, context.schema, context.seed,
                         context.memory, context.tasks)

    def regroup(self, plan: PackPlan, input: Input, probe: Probe) -> Exchange:
        from batchtool.ops.pack.rows import exchange

        return exchange(plan, input, probe)

    def expected(self, plan: PackPlan, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict[str, Any]]:
        from batchtool.ops.pack.plan import batch_layout, planned

        info = planned(plan, batch_layout(plan))
        return info["rows"], info

    def said(self, stats: dict[str, Any]) -> Said:
        """With --segment-multiple, the padding inside pieces (which the efficiencies count as padding)."""
        padding = stats.get("segment_padding_steps")
        return Said(note=(f"{padding:,} steps of padding inside pieces",) if isinstance(padding, int) else ())


OP = Pack()


__all__ = ["OP", "Pack", "PackColumns", "PackOptions", "assemble", "output_schema"]
