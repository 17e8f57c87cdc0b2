"""The `pack` op's run: its Operation (its declaration, DECLARED, is the package's)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.io.dataset import Chunk
from batchtool.io.output import OutputOptions
from batchtool.io.padding import row_lengths
from batchtool.ops import names as own
from batchtool.ops.base import Context, Kind, Operation, OutputRows, Pass, Said
from batchtool.ops.pack import DECLARED
from batchtool.ops.pack.options import DEFAULT_BATCH_SIZE, PackColumns, PackOptions, output_schema, resolve_columns
from batchtool.ops.pack.plan import LengthCounts, PackPlan, batch_layout, check_long, count_lengths, make_plan, planned
from batchtool.ops.pack.rows import exchange
from batchtool.ops.regroup import Exchange, Input, Probe


def _no_lengths() -> LengthCounts:
    return LengthCounts(np.zeros(0, dtype=np.int64))


def _lengths(options: PackOptions, context: Context, chunk: Chunk) -> LengthCounts:
    columns = resolve_columns(options, context.schema)
    lengths = row_lengths(chunk.data.column(columns.length))
    for role, column in columns.adopted.items():
        own.check_adopted(chunk, column, lengths, context.locate, "pack", role, "the example has {} steps")
    check_long(lengths, chunk, columns.length, options, context.locate)
    return count_lengths(lengths, options)


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
        assert stats is not None  # pack always has its first pass
        return make_plan(options, resolve_columns(options, context.schema), stats, context.schema, context.seed,
                         context.memory, context.tasks)

    def regroup(self, plan: PackPlan, input: Input, probe: Probe) -> Exchange:
        return exchange(plan, input, probe)

    def expected(self, plan: PackPlan, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict[str, Any]]:
        info = planned(plan, batch_layout(plan))
        return info["rows"], info

    def said(self, stats: dict[str, Any]) -> Said:
        """With --segment-multiple, the padding inside pieces (which the efficiencies count as padding)."""
        padding = stats.get("segment_padding_steps")
        return Said(note=(f"{padding:,} steps of padding inside pieces",) if isinstance(padding, int) else ())


OP = Pack()


__all__ = ["OP", "Pack", "PackColumns", "PackOptions", "assemble", "output_schema"]
