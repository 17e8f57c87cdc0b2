"""The columns an op writes of its own, named once for every op: `--output-column OUT=NAME` (the pipeline key
`output-column`), the error for an input column the op would write twice, the input columns it adopts instead (one
that already holds what the op computes, checked row by row in a pass the op makes anyway), and the names a batchtool
output's manifest records (which ops/written.py reads back for `batchtool.load`, `inspect` and `check`).

An op declares its own columns by their default names (its roles) with `output_column(roles)`, resolves them with
`named(roles, options.output_column)` and records the renamed ones with `recorded(...)`; nothing else in the package
spells `--output-column`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from batchtool.core.errors import OptionError, OptionSchemaError
from batchtool.ops.base import ColumnError
from batchtool.core.options import Pairs, option

if TYPE_CHECKING:  # an op's options import this module, and --help imports no arrays (tests/cli/test_cli_imports.py)
    import numpy as np
    import pyarrow as pa

    from batchtool.io.dataset import Chunk

FIELD = "output_column"
"""The options field (and so `--output-column`, `output-column`) of every op that writes columns of its own."""
RECORDED = "output_columns"
"""Where a command's manifest records the renamed ones, {OUT: NAME} (bucket: [[OUT, NAME], ...])."""


class OutputColumns(Pairs):
    """OUT=NAME pairs: an op's own output column OUT (one of `roles`, the columns' default names) written as NAME."""

    def __init__(self, roles: Sequence[str]) -> None:
        super().__init__("OUT=NAME", names=True, split=True, example=f"{roles[0]}=my_{roles[0]}")
        self.roles = tuple(roles)

    def parse(self, field: str, value: Any) -> tuple[tuple[str, str], ...]:
        pairs: tuple[tuple[str, str], ...] = super().parse(field, value)  # type: ignore[assignment]
        check_names(self.roles, pairs)
        return pairs


def check_names(roles: Sequence[str], given: Sequence[tuple[str, str]]) -> None:
    """OptionErrors for a pair naming no own column, a column named twice, or two columns given one name: what an
    op's options check on construction (and its --output-column's value kind on parsing)."""
    for role, name in given:
        if role not in roles or not name:
            raise OptionError(FIELD, f"expected OUT=NAME with OUT one of {', '.join(roles)} and a non-empty NAME",
                              value=f"{role}={name}")
    given_roles = [role for role, _ in given]
    twice = next((r for r in given_roles if given_roles.count(r) > 1), None)
    if twice is not None:
        raise OptionError(FIELD, f"{twice} named twice")
    names = list(named(roles, given).values())
    same = next((n for n in names if names.count(n) > 1), None)
    if same is not None:
        raise OptionError(FIELD, f"two output columns would be named {same!r}")


def output_column(roles: Sequence[str]) -> Any:
    """The `output_column` field of an op's options: --output-column OUT=NAME for each of its own columns."""
    return option(f"Name an output column ({', '.join(roles)}) otherwise, e.g. when the input already has a column "
                  "of that name; repeatable.", OutputColumns(roles), ())


def named(roles: Sequence[str], given: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each own column's name: its default, or the one --output-column gives."""
    return {**{role: role for role in roles}, **dict(given)}


def recorded(given: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """What a command's manifest options add: the renamed columns, {OUT: NAME}; nothing when none is."""
    return {RECORDED: dict(given)} if given else {}


def clash(op: str, role: str, name: str, *, steps: Sequence[str] = (), also: str = "") -> ColumnError:
    """An input column named like one of `op`'s own columns, which would be written twice: the ways out (for a
    role in `steps`, counting real steps, passing the column as --input-length too; `also`: the op's own)."""
    hint = ", or give yours as {input_length} if it counts real steps" if role in steps else ""
    return ColumnError(FIELD, f"column {name!r} is also an output column of {op}; name {op}'s otherwise with "
                              f"{{output_column}} {role}=NEW_NAME{hint}{also} (or rename yours, e.g. a rename stage "
                              "of `batchtool run`)", mentions=("input_length", "context"))


def refuse_clashes(op: str, names: Mapping[str, str], written: Iterable[str], *, steps: Sequence[str] = (),
                   also: str = "") -> None:
    """The clash error for the first own column whose name is one of the input columns `written` through."""
    kept = set(written)
    for role, name in names.items():
        if name in kept:
            raise clash(op, role, name, steps=steps, also=also)


def adopted(schema: pa.Schema, names: Mapping[str, str], roles: Sequence[str]) -> dict[str, str]:
    """{role: input column} for the `roles` whose name an integer input column has: the op takes such a column for
    its own when it holds what the op computes on every row (`check_adopted`), and writes it once."""
    import pyarrow as pa
    return {role: names[role] for role in roles
            if names[role] in schema.names and pa.types.is_integer(schema.field(names[role]).type)}


def check_adopted(chunk: Chunk, column: str, computed: np.ndarray, locate: Callable[[int], str], op: str, role: str,
                  what: str, *, steps: Sequence[str] = ()) -> None:
    """An adopted column must equal what `op` computes (`what`, e.g. "the sequence has 12 steps" is
    f"the sequence has {value} steps") row by row; the first row where it does not is an error naming that row and
    the ways out."""
    import numpy as np
    import pyarrow.compute as pc

    arr = chunk.data.column(column)
    given = pc.fill_null(arr, -1).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((given != computed) | arr.is_null().to_numpy(zero_copy_only=False))
    if not len(bad):
        return
    i = int(bad[0])
    value = arr[i].as_py()
    hint = ", or give yours as {input_length} if it counts real steps" if role in steps else ""
    raise OptionSchemaError(FIELD, f"{'null' if value is None else value} but {what.format(computed[i])}; {op} writes "
                                   f"its own {column!r} column and takes yours only when it holds that on every row: "
                                   f"name {op}'s otherwise with {{output_column}} {role}=NEW_NAME{hint} (or rename "
                                   "yours, e.g. a rename stage of `batchtool run`)",
                            mentions=("input_length",), where=f"{locate(int(chunk.ids[i]))}, column {column!r}: ")


__all__ = ["FIELD", "RECORDED", "OutputColumns", "adopted", "check_adopted", "check_names", "clash", "named",
           "output_column", "recorded", "refuse_clashes"]
