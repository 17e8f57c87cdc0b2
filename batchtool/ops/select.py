"""`select`: keep some columns, in the order given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dataclasses import dataclass

from batchtool.ops.base import Columns, Declaration, Operation, need_columns, row_stats
from batchtool.core.options import ColumnList, option

if TYPE_CHECKING:  # arrays are imported where the op runs: `select --help` imports none
    import pyarrow as pa

    from batchtool.core.tally import Tally
    from batchtool.io.dataset import Chunk


@dataclass(frozen=True)
class SelectOptions:
    columns: tuple[str, ...] = option("Columns to keep, in this order.", ColumnList())


DECLARED = Declaration(
    "select",
    summary="Keep these columns of SRC, in this order, and write DST.",
    example="batchtool select sample_data/parquet /tmp/selected --columns key,label,tokens",
    options=SelectOptions)


class Select(Operation[SelectOptions, SelectOptions], declared=DECLARED):
    def output_schema(self, options: SelectOptions, schema: pa.Schema) -> pa.Schema:
        import pyarrow as pa

        need_columns(schema, "columns", options.columns)
        return pa.schema([schema.field(c) for c in options.columns], metadata=schema.metadata)

    def input_columns(self, options: SelectOptions, columns: Columns) -> Columns:
        return list(options.columns) if columns is None else columns

    def kernel(self, plan: SelectOptions, chunk: Chunk) -> tuple[Chunk, Tally]:
        from batchtool.io.dataset import Chunk

        names = chunk.data.schema.names
        out = Chunk(chunk.data.select([c for c in plan.columns if c in names]), chunk.ids)
        return out, row_stats(chunk.num_rows, chunk.num_rows)

    def expected(self, plan: SelectOptions, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict]:
        return rows_in, {}


OP = Select()
