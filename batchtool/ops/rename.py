"""`rename`: give columns new names (the data is untouched)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dataclasses import dataclass

from batchtool.ops.base import ColumnError, Columns, Declaration, Operation, need_columns, row_stats
from batchtool.core.options import Pairs, option

if TYPE_CHECKING:  # arrays are imported where the op runs: `rename --help` imports none
    import pyarrow as pa

    from batchtool.core.tally import Tally
    from batchtool.io.dataset import Chunk


@dataclass(frozen=True)
class RenameOptions:
    columns: tuple[tuple[str, str], ...] = option(
        "Columns to rename, as OLD=NEW pairs.",
        Pairs("OLD=NEW", names=True, split=True, example="label=class", twice="a column is renamed twice ({})",
              same="two columns are renamed to the same name ({})", metavar="OLD=NEW[,OLD=NEW...]"))


DECLARED = Declaration(
    "rename",
    summary="Rename columns of SRC (OLD=NEW pairs) and write DST.",
    example="batchtool rename sample_data/parquet /tmp/renamed --columns label=class,tokens=ids",
    options=RenameOptions)


class Rename(Operation[RenameOptions, RenameOptions], declared=DECLARED):
    def output_schema(self, options: RenameOptions, schema: pa.Schema) -> pa.Schema:
        import pyarrow as pa

        mapping = dict(options.columns)
        need_columns(schema, "columns", list(mapping))
        names = [mapping.get(n, n) for n in schema.names]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ColumnError("columns", f"renaming gives two columns named {clash[0]!r} "
                                         f"(columns: {', '.join(schema.names)})")
        return pa.schema([f.with_name(n) for f, n in zip(schema, names)], metadata=schema.metadata)

    def input_columns(self, options: RenameOptions, columns: Columns) -> Columns:
        back = {new: old for old, new in options.columns}
        return None if columns is None else [back.get(c, c) for c in columns]

    def kernel(self, plan: RenameOptions, chunk: Chunk) -> tuple[Chunk, Tally]:
        from batchtool.io.dataset import Chunk

        mapping = dict(plan.columns)
        out = Chunk(chunk.data.rename_columns([mapping.get(n, n) for n in chunk.data.schema.names]), chunk.ids)
        return out, row_stats(chunk.num_rows, chunk.num_rows)

    def expected(self, plan: RenameOptions, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict]:
        return rows_in, {}


OP = Rename()
