"""The operation interface: one definition per op, from which its command, its pipeline stage and its dry run are derived.

An op is a subclass of `Operation` registered in `batchtool.ops.OPERATIONS`. It declares its options as
a frozen dataclass whose fields are made with `option(...)` (help, value kind, default): click options,
pipeline TOML keys and their checks are all generated from that one schema. Its work is a pure kernel
`kernel(plan, chunk) -> (chunk, stats)` that mutates nothing shared; the driver merges the statistics
in input order, so they do not depend on threads or engine. Problems with an option raise
`OptionError(field, problem)`, which each front end renders in its own words (`--batch-size` on the
command line, `key 'batch-size'` in a pipeline file).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import pyarrow as pa

from batchtool.dataset import Chunk
from batchtool.errors import BatchtoolError

O = TypeVar("O")
"""An op's options (its frozen dataclass)."""
P = TypeVar("P")
"""An op's plan (its options when it has no first pass)."""
Stats = dict[str, Any]
"""Per-chunk statistics: numbers and NumPy arrays by name, merged by adding them (see `add_stats`)."""
Columns = list[str] | None
"""Column names, or None for all of them."""


class Kind(enum.Enum):
    """What an op does to the order and grouping of rows (what may come after it in a pipeline)."""

    ROWS = "rows"
    """Maps each chunk on its own; order and chunking are kept."""
    REORDERS = "reorders"
    """Reorders rows globally (spills before it emits)."""
    BATCHES = "batches"
    """Writes batches a later op would regroup: it must come last."""


class OptionError(BatchtoolError):
    """An option's value, or the column it names, is unusable. `field` is the options field; the command
    line says `--field-name`, a pipeline file `key 'field-name'` (see `rendered`)."""

    def __init__(self, field: str, problem: str, where: str = "") -> None:
        self.field, self.problem, self.where = field, problem, where
        super().__init__(self.rendered(flag))

    def rendered(self, name: Callable[[str], str]) -> str:
        return f"{self.where}{name(self.field)}: {self.problem}"

    def at(self, where: str) -> OptionError:
        """The same problem, prefixed with the place it was found in (SRC, for a command)."""
        return OptionError(self.field, self.problem, f"{where}: ")


def flag(field: str) -> str:
    """A field's command-line flag: batch_size -> --batch-size."""
    return "--" + key(field)


def key(field: str) -> str:
    """A field's pipeline-file key: batch_size -> batch-size."""
    return field.replace("_", "-")


def toml_key(field: str) -> str:
    """How a pipeline file's messages name a field: key 'batch-size'."""
    return f"key {key(field)!r}"


# -- values: how a field's text (command line) or TOML value becomes its Python value ---------------------------


class Value:
    """A kind of option value. `parse` takes what TOML gives (the command line gives the same shapes:
    a string, or for `multiple` kinds the list of its repeated, comma-separated texts)."""

    multiple: ClassVar[bool] = False
    metavar: ClassVar[str] = "TEXT"

    def parse(self, field: str, value: Any) -> Any:
        raise NotImplementedError


def shown(value: Any) -> str:
    """A TOML value as a message shows it: its kind and repr."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


class Column(Value):
    """One column name."""

    metavar = "COL"

    def parse(self, field: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise OptionError(field, f"expected a column name, got {shown(value)}")
        return value


def _texts(field: str, value: Any, what: str) -> list[str]:
    """A list of strings, each possibly comma-separated, as one list of non-empty parts."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise OptionError(field, f"expected {what}, got {shown(value)}")
    parts = []
    for item in items:
        split = [part.strip() for part in item.split(",")]
        if not all(split):
            raise OptionError(field, f"{item!r} has an empty name (give NAME or NAME,NAME,...)")
        parts += split
    return parts


class ColumnList(Value):
    """Column names, in order: COL,COL,... (repeatable) or a TOML list; each named once."""

    multiple = True
    metavar = "COL[,COL...]"

    def parse(self, field: str, value: Any) -> tuple[str, ...]:
        names = _texts(field, value, "a non-empty list of column names")
        if len(set(names)) != len(names):
            raise OptionError(field, f"a column is named twice ({', '.join(names)})")
        return tuple(names)


class Renames(Value):
    """OLD=NEW pairs: OLD=NEW,... (repeatable), a TOML list of "OLD=NEW" or a table {OLD = "NEW"}."""

    multiple = True
    metavar = "OLD=NEW[,OLD=NEW...]"

    def parse(self, field: str, value: Any) -> tuple[tuple[str, str], ...]:
        if isinstance(value, dict):
            pairs = [(str(old), new) for old, new in value.items()]
            if not pairs or not all(isinstance(new, str) and new for _, new in pairs):
                raise OptionError(field, f'expected a table of old = "new" names, got {shown(value)}')
        else:
            pairs = []
            for text in _texts(field, value, "OLD=NEW pairs"):
                old, sep, new = text.partition("=")
                if not sep or not old.strip() or not new.strip():
                    raise OptionError(field, f"{text!r} is not an OLD=NEW pair")
                pairs.append((old.strip(), new.strip()))
        old, new = [o for o, _ in pairs], [n for _, n in pairs]
        if len(set(old)) != len(old):
            raise OptionError(field, f"a column is renamed twice ({', '.join(old)})")
        if len(set(new)) != len(new):
            raise OptionError(field, f"two columns are renamed to the same name ({', '.join(new)})")
        return tuple(pairs)


@dataclasses.dataclass(frozen=True)
class Option:
    """A field's declaration: its help text and value kind (the flag and key come from the field's name)."""

    help: str
    value: Value


def option(help: str, value: Value, default: Any = dataclasses.MISSING) -> Any:
    """An options-dataclass field with what its command-line option and pipeline key are generated from."""
    return dataclasses.field(default=default, metadata={"option": Option(help, value)})


def fields(options: type) -> list[tuple[dataclasses.Field, Option]]:
    """The declared option fields of an options dataclass, in order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(options) if "option" in f.metadata]


def required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]


def build(options: type[O], given: Mapping[str, Any]) -> O:
    """The options from {field: raw value} (absent fields take their defaults): every value parsed by its
    kind, then the dataclass's own checks. Every problem is an OptionError naming the field."""
    values = {}
    for f, decl in fields(options):
        if f.name in given:
            values[f.name] = decl.value.parse(f.name, given[f.name])
        elif required(f):
            raise OptionError(f.name, "missing (required)")
    return options(**values)


# -- the interface -----------------------------------------------------------------------------------------------


def add_stats(a: Stats, b: Stats) -> Stats:
    """Two chunks' statistics as one: values with the same name add (counts and per-class arrays)."""
    out = dict(a)
    for name, value in b.items():
        out[name] = out[name] + value if name in out else value
    return out


class Operation(Generic[O, P]):
    """One operation. A new op sets `name`, `summary`, `example`, `options` and `kind`, and writes
    `output_schema` and `kernel`; the rest has defaults for an op that needs no first pass."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """What the command does (its --help starts with this)."""
    example: ClassVar[str]
    """A command line that runs as written on sample_data/ (its --help ends with it)."""
    options: ClassVar[type]
    kind: ClassVar[Kind] = Kind.ROWS

    def needs(self, options: O) -> list[str]:
        """Input columns it reads to make its decisions, besides the ones it outputs."""
        return []

    def output_schema(self, options: O, schema: pa.Schema) -> pa.Schema:
        """The schema it writes given the one it reads; an OptionError for a missing or unusable column."""
        raise NotImplementedError

    def input_columns(self, options: O, columns: Columns) -> Columns:
        """The input columns needed for these output columns (None: all)."""
        return None if columns is None else list(dict.fromkeys([*columns, *self.needs(options)]))

    # first pass (optional): per-chunk statistics, merged in input order, make the plan
    def first_pass_columns(self, options: O) -> list[str]:
        """The columns its first pass reads; [] when it has none."""
        return []

    def first_pass(self, options: O, chunk: Chunk) -> Stats:
        raise NotImplementedError(f"{self.name} has no first pass")

    def plan(self, options: O, schema: pa.Schema, stats: Stats | None) -> P:
        """What the kernel needs, from the options and the first pass's merged statistics (None: no pass)."""
        return options  # type: ignore[return-value]

    def kernel(self, plan: P, chunk: Chunk) -> tuple[Chunk, Stats]:
        """One chunk's output and statistics; pure (runs on any worker, in any order)."""
        raise NotImplementedError

    def report(self, plan: P, stats: Stats) -> dict[str, Any]:
        """The manifest's statistics from the kernels' merged ones."""
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in stats.items()}

    def expected(self, plan: P, rows_in: int | None) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing."""
        return None, {}


def need_columns(schema: pa.Schema, field: str, names: Sequence[str]) -> None:
    """An OptionError naming the field for the first of `names` that the schema lacks."""
    for name in names:
        if name not in schema.names:
            raise OptionError(field, f"no column {name!r} in the input (columns: {', '.join(schema.names)})")


def row_stats(rows_in: int, rows_out: int) -> Stats:
    """What every row op reports per chunk."""
    return {"rows_in": rows_in, "rows_out": rows_out}


__all__ = ["Column", "ColumnList", "Kind", "Operation", "Option", "OptionError", "Renames", "Stats", "Value",
           "add_stats", "build", "fields", "flag", "key", "need_columns", "option", "row_stats", "toml_key"]
