"""`filter`: keep the rows where a boolean column is true (null counts as false, as bucket's --keep)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchtool.ops.base import ColumnError, Declaration, Operation, need_columns, row_stats
from batchtool.core.options import Column, option

if TYPE_CHECKING:  # arrays are imported where the op runs: `filter --help` imports none
    import pyarrow as pa

    from batchtool.core.tally import Tally
    from batchtool.io.dataset import Chunk


@dataclass(frozen=True)
class FilterOptions:
    column: str = option("Boolean column: keep the rows where it is true (null is false).", Column())


DECLARED = Declaration(
    "filter",
    summary="Keep the rows of SRC where a boolean column is true (null is false) and write DST.",
    example="batchtool filter sample_data/flagged.parquet /tmp/kept --column keep",
    options=FilterOptions)


class Filter(Operation[FilterOptions, FilterOptions], declared=DECLARED):
    def input_columns(self, options: FilterOptions, columns: list[str] | None) -> list[str] | None:
        return None if columns is None else list(dict.fromkeys([*columns, options.column]))

    def output_schema(self, options: FilterOptions, schema: pa.Schema) -> pa.Schema:
        need_columns(schema, "column", [options.column])
        import pyarrow as pa

        kind = schema.field(options.column).type
        if not pa.types.is_boolean(kind):
            raise ColumnError("column", f"column {options.column!r} is {kind}, expected bool")
        return schema

    def kernel(self, plan: FilterOptions, chunk: Chunk) -> tuple[Chunk, Tally]:
        from batchtool.ops.rows import keep_mask

        mask = keep_mask(chunk, plan.column)
        out = chunk if mask.all() else chunk.filter(mask)
        return out, row_stats(chunk.num_rows, out.num_rows)


OP = Filter()
