"""What a rule needs of a column (that it exists, and its type), checked the same way on SRC and on a drift baseline,
so both name the rule, the column and what was expected in the same words."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from batchtool.core.errors import SchemaError
from batchtool.core.options import suggest
from batchtool.io.padding import element_type
from batchtool.io.stats import is_sequence_type


@dataclass(frozen=True)
class ColumnType:
    """A type a rule needs: the test, and how an error says what was expected."""

    ok: Callable[[pa.DataType], bool]
    what: str


LABEL = ColumnType(pa.types.is_integer, "an integer label column")
LENGTH = ColumnType(lambda t: is_sequence_type(t) or pa.types.is_integer(t),
                    "a list column or an integer length column")
FLOATS = ColumnType(lambda t: pa.types.is_floating(element_type(t)), "a float or list-of-float column")
SEQUENCE = ColumnType(is_sequence_type, "a list (sequence) column")


def need(who: str, schema: pa.Schema, column: str, expected: ColumnType | None = None,
         source: str | None = None) -> None:
    """SchemaError naming `who` (a rule or an option) unless `schema` (that of `source`, e.g. "the baseline X", when
    it is not SRC's) has `column`, of the `expected` type when given."""
    if column not in schema.names:
        has = f"{source} has no column" if source else "no column"
        raise SchemaError(f"{who}: {has} {column!r}{suggest(column, schema.names, 'columns')}")
    if expected is not None and not expected.ok(schema.field(column).type):
        of = f" of {source}" if source else ""
        raise SchemaError(f"{who}: column {column!r}{of} is {schema.field(column).type}, expected {expected.what}")
