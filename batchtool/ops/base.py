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
import difflib
import enum
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import BatchtoolError, OptionError, SchemaError, UsageError, flag, key

if TYPE_CHECKING:
    from batchtool.output import OutputOptions
    from batchtool.workspace import Workspace

O = TypeVar("O")
"""An op's options (its frozen dataclass)."""
P = TypeVar("P")
"""An op's plan (its options when it has no first pass)."""
Columns = list[str] | None
"""Column names, or None for all of them."""
Scan = Callable[[list[str], Callable[[Chunk], Any]], Iterator[Any]]
"""A pass over some columns of the input: fn(chunk) per chunk, in input order (see Context.scan)."""


class Kind(enum.Enum):
    """What an op does to the order and grouping of rows (what may come after it in a pipeline)."""

    ROWS = "rows"
    """Maps each chunk on its own; order and chunking are kept."""
    REORDERS = "reorders"
    """Reorders rows globally (spills before it emits)."""
    BATCHES = "batches"
    """Writes batches a later op would regroup: it must come last."""


class ColumnError(OptionError, SchemaError):
    """An option names a column the input lacks, or one whose type it cannot use."""


# -- values: how a field's text (command line) or TOML value becomes its Python value ---------------------------


class Value:
    """A kind of option value. `parse` takes what TOML gives; `from_text` turns the command line's text
    (for `multiple` kinds, the list of its repeated texts) into that shape first."""

    multiple: ClassVar[bool] = False
    is_flag: ClassVar[bool] = False
    negatable: ClassVar[bool] = False
    """A flag with an off form too: `--NAME/--no-NAME` on the command line, `no-NAME = true` in a pipeline file."""
    metavar: ClassVar[str | None] = "TEXT"

    def __init__(self, *, metavar: str | None = None) -> None:
        """`metavar` names the value in --help where the help text names it (`--max-tokens T`)."""
        if metavar is not None:
            self.metavar = metavar  # type: ignore[misc]

    def from_text(self, field: str, text: Any) -> Any:
        return text

    def parse(self, field: str, value: Any) -> Any:
        raise NotImplementedError


class Flag(Value):
    """On or off: `--flag` on the command line, true/false in a pipeline file."""

    is_flag = True
    metavar = None

    def parse(self, field: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise OptionError(field, f"expected true or false, got {shown(value)}")
        return value


class Number(Value):
    """A number (a TOML integer or float; a string is refused, not converted)."""

    metavar = "FLOAT"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return float(text)
        except ValueError:
            raise OptionError(field, f"{text!r} is not a number") from None

    def parse(self, field: str, value: Any) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise OptionError(field, f"expected a number, got {shown(value)}")
        return float(value)


class Integer(Value):
    """A whole number (`metavar`: what the help calls it, e.g. "L" when other help texts refer to it)."""

    metavar = "INTEGER"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return int(text)
        except ValueError:
            raise OptionError(field, f"{text!r} is not an integer") from None

    def parse(self, field: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise OptionError(field, f"expected an integer, got {shown(value)}")
        if not -(1 << 63) <= value < 1 << 63:  # every count and size batchtool holds is a 64-bit integer
            raise OptionError(field, "must fit in 64 bits (at most 9223372036854775807)", value=str(value))
        return value


class NumberOrColumn(Value):
    """A constant (a number) or the name of a column holding one per row."""

    metavar = "COL|X"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return float(text)
        except ValueError:
            return text

    def parse(self, field: str, value: Any) -> float | str:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or value == "":
            raise OptionError(field, f"expected a number or a column name, got {shown(value)}")
        return float(value) if isinstance(value, (int, float)) else value


def shown(value: Any) -> str:
    """A TOML value as a message shows it: its kind and repr."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


class Choice(Value):
    """One of a few words."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.metavar = f"[{'|'.join(self.choices)}]"  # type: ignore[misc]

    def parse(self, field: str, value: Any) -> str:
        if value not in self.choices:
            raise OptionError(field, f"expected one of {', '.join(self.choices)}",
                              value=repr(value) if isinstance(value, str) else shown(value))
        return value


class Column(Value):
    """One column name."""

    metavar = "COL"

    def parse(self, field: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise OptionError(field, f"expected a column name, got {shown(value)}")
        return value


def _texts(field: str, value: Any, what: str, empty: str = "an empty name (give NAME or NAME,NAME,...)") -> list[str]:
    """A list of strings, each possibly comma-separated, as one list of non-empty parts."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise OptionError(field, f"expected {what}, got {shown(value)}")
    parts = []
    for item in items:
        split = [part.strip() for part in item.split(",")]
        if not all(split):
            raise OptionError(field, f"{item!r} has {empty}")
        parts += split
    return parts


class ColumnList(Value):
    """Column names, in order: COL,COL,... (repeatable) or a TOML list; each named once (with `dedupe`, a name
    given twice counts once instead)."""

    multiple = True
    metavar = "COL[,COL...]"

    def __init__(self, *, dedupe: bool = False, metavar: str | None = None) -> None:
        super().__init__(metavar=metavar)
        self.dedupe = dedupe

    def parse(self, field: str, value: Any) -> tuple[str, ...]:
        names = _texts(field, value, "a non-empty list of column names",
                       "an empty column name (give COL or COL,COL,...)")
        if self.dedupe:
            return tuple(dict.fromkeys(names))
        if len(set(names)) != len(names):
            raise OptionError(field, f"a column is named twice ({', '.join(names)})")
        return tuple(names)


class Pairs(Value):
    """KEY=VALUE pairs, the one kind for every option of them: repeatable on the command line (with `split`, also
    comma-separated: OLD=NEW,OLD=NEW; without, a value may hold commas), a TOML string, list of strings or table
    {KEY = VALUE}. With `names` each pair becomes (key, name), both non-empty (renames, output columns' names);
    without, each is kept as written (`tokens=-1`), for a check that needs the schema (pad values). `twice` and
    `same` are the problems of a key, or a name, given twice (`{}`: all of them), when that is one."""

    multiple = True

    def __init__(self, pair: str, *, names: bool = False, split: bool = False, example: str | None = None,
                 twice: str | None = None, same: str | None = None, metavar: str | None = None) -> None:
        """`pair` says what one is (COL=V: the messages' and, without `metavar`, the help's name for it);
        `example` one that a message about a malformed pair shows."""
        super().__init__(metavar=metavar or pair)
        self.pair, self.names, self.split, self.example = pair, names, split, example
        self.twice, self.same = twice, same

    def parse(self, field: str, value: Any) -> tuple[str, ...] | tuple[tuple[str, str], ...]:
        if isinstance(value, dict):
            if not self.names:
                return tuple(f"{k}={v}" for k, v in value.items())
            if not value or not all(isinstance(v, str) and v for v in value.values()):
                key_word, name_word = self.pair.lower().split("=")
                raise OptionError(field, f'expected a table of {key_word} = "{name_word}" names, got {shown(value)}')
            return self._checked(field, [(str(k), v) for k, v in value.items()])
        if self.split:
            texts = _texts(field, value, f"{self.pair} pairs",
                           f"an empty pair (give {self.pair} or {self.pair},{self.pair},...)")
        else:
            texts = [value] if isinstance(value, str) else value
            if not isinstance(texts, list) or not all(isinstance(v, str) for v in texts):
                raise OptionError(field, f"expected {self.pair} pairs, got {shown(value)}")
        if not self.names:
            return tuple(texts)
        pairs = []
        for text in texts:
            k, sep, v = text.partition("=")
            if not sep or not k.strip() or not v.strip():
                raise OptionError(field, f"expected {self.pair}" + (f", e.g. {self.example}" if self.example else ""),
                                  value=repr(text))
            pairs.append((k.strip(), v.strip()))
        return self._checked(field, pairs)

    def _checked(self, field: str, pairs: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        for problem, given in ((self.twice, [k for k, _ in pairs]), (self.same, [v for _, v in pairs])):
            if problem is not None and len(set(given)) != len(given):
                raise OptionError(field, problem.format(", ".join(given)))
        return tuple(pairs)


class Wording:
    """How a kind says a value has the wrong type: `expected an integer, got string 'x'` as flags and pipeline
    files say it, or in a file's own words (`verb`, and `names` for the types of the values it shows)."""

    def __init__(self, verb: str = "expected", names: Mapping[type, str] | None = None) -> None:
        self.verb, self.names = verb, names

    def shown(self, value: Any) -> str:
        """A value as a message shows it: its type's name and repr."""
        return shown(value) if self.names is None else f"{self.names.get(type(value), type(value).__name__)} {value!r}"

    def wrong(self, field: str, what: str, value: Any) -> OptionError:
        return OptionError(field, f"{self.verb} {what}, got {self.shown(value)}")


class Typed(Value):
    """A TOML value of one type (str, int, float, bool; an int is a float too), or an array of them (`array`),
    exactly `count` of them if given; arrays are read as tuples. For a file that speaks in TOML's types."""

    NAMES: ClassVar[dict[type, str]] = {str: "string", int: "integer", float: "number", bool: "boolean"}

    def __init__(self, type_: type, *, array: bool = False, count: int | None = None,
                 wording: Wording | None = None) -> None:
        super().__init__(metavar=self.NAMES[type_].upper())
        self.type, self.array, self.count, self.wording = type_, array or count is not None, count, wording or Wording()

    def what(self) -> str:
        name = self.NAMES[self.type]
        if self.array:
            return f"a list of {'' if self.count is None else f'{self.count} '}{name}s"
        return f"an {name}" if name[0] in "aeiou" else f"a {name}"

    def parse(self, field: str, value: Any) -> Any:
        if not self.array:
            if not self._is(value):
                raise self.wording.wrong(field, self.what(), value)
            return float(value) if self.type is float else value
        if (not isinstance(value, (list, tuple)) or not all(self._is(v) for v in value)
                or self.count is not None and len(value) != self.count):
            raise self.wording.wrong(field, self.what(), value)
        return tuple(float(v) if self.type is float else v for v in value)

    def _is(self, value: Any) -> bool:
        if self.type in (int, float) and isinstance(value, bool):
            return False
        return isinstance(value, (int, float) if self.type is float else self.type)


class TextTable(Value):
    """A TOML table of strings {KEY = "VALUE"}, read as (key, value) pairs in order; `what` says what a pair is
    (`column = "type"`)."""

    def __init__(self, what: str, *, wording: Wording | None = None) -> None:
        super().__init__(metavar="TABLE")
        self.what, self.wording = what, wording or Wording()

    def parse(self, field: str, value: Any) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.wording.wrong(field, f"a table of {self.what}", value)
        return tuple((str(k), v) for k, v in value.items())


@dataclasses.dataclass(frozen=True)
class Option:
    """A field's declaration: its help text and value kind (the flag and key come from the field's name)."""

    help: str
    value: Value
    required: bool = False
    """Must be given even though the dataclass has a default (for callers that build it directly)."""


def option(help: str, value: Value, default: Any = dataclasses.MISSING, *, required: bool = False) -> Any:
    """An options-dataclass field with what its command-line option and pipeline key are generated from."""
    return dataclasses.field(default=default, metadata={"option": Option(help, value, required)})


def fields(options: type) -> list[tuple[dataclasses.Field, Option]]:
    """The declared option fields of an options dataclass, in order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(options) if "option" in f.metadata]


def required(f: dataclasses.Field) -> bool:
    return (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
            or f.metadata.get("option", Option("", Value())).required)


def from_texts(options: type, given: Mapping[str, Any]) -> dict[str, Any]:
    """Command-line values (text, tuples of texts, flags) as the values `build` takes."""
    kinds = {f.name: decl.value for f, decl in fields(options)}
    return {name: kinds[name].from_text(name, list(v) if isinstance(v, tuple) else v) for name, v in given.items()}


def build(options: type[O], given: Mapping[str, Any], **settings: Any) -> O:
    """The options from {field: raw value} (absent fields take their defaults): every value parsed by its
    kind, then the dataclass's own checks. Every problem is an OptionError naming the field. `settings` are
    fields that are not options of the op (the pipeline's memory for a spilling op), passed as they are."""
    values = dict(settings)
    for f, decl in fields(options):
        if f.name in given:
            values[f.name] = decl.value.parse(f.name, given[f.name])
        elif required(f):
            raise OptionError(f.name, "missing (required)")
    return options(**values)


class TableError(UsageError):
    """A key of a table that its schema does not take (`unknown`, with the keys it does: `allowed`) or a required
    one it lacks (`missing`); the message is in a pipeline file's words, and a file with its own re-words it."""

    def __init__(self, key: str, message: str, *, unknown: bool = False, missing: bool = False,
                 allowed: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.key, self.unknown, self.missing, self.allowed = key, unknown, missing, tuple(allowed)


def suggest(key: str, allowed: Sequence[str]) -> str:
    """The allowed key closest to a mistyped one, or all of them."""
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (keys: {', '.join(allowed)})"


def read_table(options: type[O], table: Mapping[str, Any], *, name: Callable[[str], str] = key,
               **settings: Any) -> O:
    """A TOML table read through an option schema, the one reader of every file batchtool reads (pipelines, check
    rules): its keys only (`name(field)` is a field's key; `no-KEY = true` turns a negatable flag off), the required
    ones present (TableError), then `build` (OptionError naming the field). `settings` go to `build`."""
    declared = {name(f.name): f for f, _ in fields(options)}
    flags = {text[2:]: name(field) for field, text in getattr(options, "FLAGS", {}).items()}
    for given in table:
        if given in flags and given not in declared:  # [output] to = ...: the command line's name
            raise TableError(given, f"unknown key {given!r} (did you mean {flags[given]!r}?)", unknown=True,
                             allowed=[flags[given]])
    negated = {f"no-{name(f.name)}": f for f, decl in fields(options) if decl.value.negatable}
    allowed = [*declared, *negated]
    for given in table:
        if given not in allowed:
            raise TableError(given, f"unknown key {given!r}{suggest(given, allowed)}", unknown=True, allowed=allowed)
    for given, f in declared.items():
        if required(f) and given not in table:
            raise TableError(given, f"missing key {given!r}", missing=True)
    values = {declared[k].name: v for k, v in table.items() if k in declared}
    for given, f in negated.items():  # no-pad = true is pad = false
        if given in table:
            if name(f.name) in table:
                raise TableError(given, f"keys {name(f.name)!r} and {given!r} set the same option; give one")
            if not isinstance(table[given], bool):
                raise TableError(given, f"key {given!r}: expected true or false, got {shown(table[given])}")
            values[f.name] = not table[given]
    return build(options, values, **settings)


# -- statistics ----------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Statistics of some chunks: a kernel returns its chunk's, the driver merges them in input order (`merge`),
    so totals never depend on threads or engine. Counts (numbers or NumPy arrays) add; value sums go through
    math.fsum, min and max commute; `latest` keeps the last chunk's value (a running estimate)."""

    counts: dict[str, Any] = field(default_factory=dict)
    sums: dict[str, list[float]] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)
    latest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **counts: Any) -> Tally:
        tally = cls()
        tally.add(**counts)
        return tally

    def add(self, **counts: Any) -> None:
        for name, value in counts.items():
            self.counts[name] = self.counts[name] + value if name in self.counts else value

    def add_values(self, name: str, values: np.ndarray) -> None:
        if len(values):
            self.sums.setdefault(name, []).append(float(values.sum()))
            self.low[name] = min(self.low.get(name, math.inf), float(values.min()))
            self.high[name] = max(self.high.get(name, -math.inf), float(values.max()))

    def merge(self, other: Tally) -> None:
        """Add the statistics of the chunks after these."""
        self.add(**other.counts)
        for name, sums in other.sums.items():
            self.sums.setdefault(name, []).extend(sums)
            self.low[name] = min(self.low.get(name, math.inf), other.low[name])
            self.high[name] = max(self.high.get(name, -math.inf), other.high[name])
        self.latest.update(other.latest)

    def total(self, name: str) -> float:
        return math.fsum(self.sums.get(name, []))

    def summary(self, name: str, count: int) -> dict[str, float]:
        if name not in self.sums:
            return {}
        return {"mean": self.total(name) / max(count, 1), "min": self.low[name], "max": self.high[name]}

    def count(self, name: str) -> int:
        return int(self.counts.get(name, 0))


# -- the interface -----------------------------------------------------------------------------------------------


class Depends(enum.IntEnum):
    """What an op's output depends on besides the rows it reads (a pipeline keeps what matters intact)."""

    ROWS = 0
    ORDER = 1
    """Also their ids and order (random draws are keyed by example ids)."""
    CHUNKS = 2
    """Also how they are cut into chunks (state carried from chunk to chunk)."""


@dataclass(frozen=True)
class Context:
    """What a plan may use besides the options and the first pass: the seed, and the input (its schema,
    its name, and how to name one of its rows in an error)."""

    seed: int
    schema: pa.Schema
    src: str
    locate: Callable[[int], str]
    scan: Scan | None = field(default=None, compare=False)
    """Further passes the plan may ask for (exact thresholds, the full count behind an error): scan(columns, fn)
    yields fn(chunk) for every chunk of those columns, in input order, run on the engine. None on workers."""
    first_file: str | None = None
    """The input's first file, where its schema is read: an error about a column's type names it (None: `src`)."""


class Bar(Protocol):
    def update(self, n: int) -> Any: ...


class Runtime(Protocol):
    """What the driver lends an op that regroups its whole input: the engine (an ordered map over items,
    run on threads or Ray workers) and progress bars, so that ops neither choose nor import them."""

    threads: int
    space: Workspace
    """The run's workspace (batchtool.workspace), which the engine's workers write and read: where a task leaves what
    later tasks read, instead of sending it to the driver."""

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """fn over items on the engine, results in input order (`fn` must pickle: it may run remotely)."""
        ...

    def bar(self, desc: str, total: int | None) -> AbstractContextManager[Bar]:
        """A progress bar for a pass (shown on a terminal, silent with --quiet); `desc` names the pass ("spill"),
        the runtime says whose it is (`shuffle: spill`, `stage 1 (shuffle): spill`)."""
        ...

    def apply(self, op: Operation, plan: Any, data: Dataset,
              report: ReadReport) -> tuple[Iterator[tuple[Chunk, int]], Tally]:
        """`op`'s kernel over every chunk of `data` on the engine, for an op that regroups its own kernel's
        output: the output chunks in input order, each with the input rows it completes, and the kernels'
        statistics, merged into that Tally in input order as the chunks are read."""
        ...

@dataclass
class Regrouped:
    """The output of an op that regroups its whole input (Kind.REORDERS, Kind.BATCHES), valid while its
    `regroup` context is open: the items, the work that turns one item into output batches (on the
    engine's workers) with the input rows it completes, and the statistics once every item is written."""

    items: Iterable[Any]
    work: Callable[[Any], tuple[list[pa.RecordBatch], int]]
    stats: Callable[[], dict[str, Any]]
    total_rows: int | None = None
    """The input rows the items complete (the write's progress total); None: the input's rows."""
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records."""


Probe = Callable[[Callable[[Chunk], Any]], Any]
"""probe(measure): measure(the input's first chunk) computed where the chunk is read (None: no rows)."""


@dataclass(frozen=True)
class Scatter:
    """The map side of an Exchange: every row of `schema` to (group, part), part = the range of its keyed order
    key (`stage`, `seed`) among the group's `parts` (batchtool.spill). Each part is then sorted on a worker: by
    the key (unless not `keyed`: input order), then stably by `order` if given."""

    schema: pa.Schema
    parts: tuple[int, ...]
    """Key ranges of each group."""
    seed: int
    stage: str
    flush_bytes: int
    prepare: Callable[[Chunk], tuple[Chunk, np.ndarray, Any]] | None = None
    """Run on the map worker per input chunk: the rows to scatter, each one's group, and statistics that go
    back to the driver (Scattered.stats, in input order); None: every row as read, all in group 0."""
    keyed: bool = True
    order: Callable[[pa.RecordBatch], np.ndarray] | None = None
    """The positions that put a sorted part in its final order (a stable sort: bucket's --order sorted by length,
    pack's rows by output position); None: the key's order."""


class SortedStream(Protocol):
    """One group's rows after the reduce, in order, in files every worker reads (batchtool.exchange.SortedGroup):
    one chunk per part, laid out as a local Spill.read_group yields them."""

    part_rows: tuple[int, ...]

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """The chunks from the one holding row `start` on (which begins at first_row(start))."""
        ...

    def first_row(self, start: int) -> int: ...

    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class Scattered:
    """What the map and reduce tasks made: every group's sorted rows, rows per group, and the statistics of
    Scatter.prepare, one per input chunk in input order."""

    schema: pa.Schema
    groups: list[SortedStream]
    rows: np.ndarray
    stats: list[Any]


class Batches(Protocol):
    """An exchange's output batches, cut from sorted streams where they are read: the driver plans shards from
    their sizes, and workers read any run of them through `reader`."""

    count: int
    rows: int

    def batch_rows(self, k: int) -> int: ...

    def first_row(self, k: int) -> int:
        """The output row number of batch k's first row."""
        ...

    def reader(self, start: int, end: int) -> Callable[[], Iterator[pa.RecordBatch]]:
        """Batches [start, end) as a task a worker runs (small to send: it carries only what those batches
        need), laid out exactly as `regroup` gives them."""
        ...

    def nbytes(self) -> int:
        """The sorted data's bytes, before any output encoding."""
        ...


@dataclass(frozen=True)
class Cut:
    """An exchange's output: its batches, and the manifest's statistics once they are written."""

    batches: Batches
    stats: Callable[[], dict[str, Any]]
    sequence_columns: tuple[str, ...] | None = None
    """Columns to write as feature lists should the output be tf.train.SequenceExample records (None: every list)."""


@dataclass(frozen=True)
class Exchange:
    """A regrouping as one physical plan (batchtool.exchange), run the same way on every engine: the rows scattered
    (`scatter`) to key ranges in the run's workspace by map tasks, each range sorted by a task, then
    `cut(scattered, runtime)` plans the output batches (on the driver, from counts; any pass over the sorted rows
    as tasks on the runtime), which the writer's tasks read, build and write."""

    scatter: Scatter
    cut: Callable[[Scattered, Runtime], Cut]
    rows: Callable[[Runtime, ReadReport], Iterator[tuple[Chunk, np.ndarray, Any]]] | None = None
    """For an op whose groups depend on the rows before (pack's slots, online stratify's running estimate): its rows
    to scatter, their groups and statistics, made in input order on the driver (its per-chunk work may still run
    on the runtime's workers), scattered there as one map task; None: map tasks over the input run `prepare`."""


def manifest_options(options: Any, output: OutputOptions) -> dict[str, Any]:
    """The options a manifest records: the operation's dataclass plus the output settings."""
    return {**dataclasses.asdict(options), "to": output.format, "compression": output.codec,
            "shard_rows": output.shard_rows, "shard_bytes": output.shard_bytes}


class Operation(Generic[O, P]):
    """One operation. A new op sets `name`, `summary`, `example` and `options` (and `kind`, `seeded` if they
    differ), and writes `output_schema` and `kernel`. The other methods have defaults for an op with no
    first pass, one plan for every chunk, and output no larger than its input."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """What the command does (its --help starts with this)."""
    example: ClassVar[str]
    """A command line that runs as written on sample_data/ (its --help ends with it)."""
    options: ClassVar[type]
    kind: ClassVar[Kind] = Kind.ROWS
    seeded: ClassVar[bool] = False
    """Takes a --seed (random draws keyed by it and the example ids)."""
    spills: ClassVar[bool] = False
    """Its options carry `memory` and `tmp_dir` (--memory, --tmp-dir; a pipeline's own in a pipeline)."""
    batches_flag: ClassVar[str | bool | None] = None
    """The flag with which its output is batches (written as batch shards without --to); True: always batches."""
    expands: ClassVar[bool] = False
    """The kernel's output can outgrow its input chunk: it returns a description of it, cut by `pieces`
    and built by `build` piece by piece, so that no single chunk decides memory."""

    def needs(self, options: O) -> list[str]:
        """Input columns it reads to make its decisions, besides the ones it outputs."""
        return []

    def output_schema(self, options: O, schema: pa.Schema) -> pa.Schema:
        """The schema it writes given the one it reads; an OptionError for a missing or unusable column."""
        raise NotImplementedError

    def resolved(self, options: O, schema: pa.Schema) -> O:
        """The options with what defaults to the input's columns filled in (segment's context): a command
        records these in its manifest."""
        return options

    def recorded(self, options: O, output: OutputOptions) -> dict[str, Any]:
        """What the manifest's `options` records."""
        return manifest_options(options, output)

    def input_columns(self, options: O, columns: Columns) -> Columns:
        """The input columns needed for these output columns (None: all)."""
        return None if columns is None else list(dict.fromkeys([*columns, *self.needs(options)]))

    def kind_of(self, options: O) -> Kind:
        """Its kind with these options (stratify makes batches only with --batch-size)."""
        return self.kind

    def depends(self, options: O) -> Depends:
        return Depends.ORDER if self.seeded else Depends.ROWS

    # -- first pass (optional): per-chunk statistics, merged in input order, make the plan
    def first_pass_columns(self, options: O) -> list[str]:
        """The columns its first pass reads; [] when it has none."""
        return []

    def first_pass_input(self, options: O, schema: pa.Schema) -> list[str]:
        """The columns its first pass reads from an input of this schema: `first_pass_columns`, unless the input
        decides them (bucket and pack measure the input's first list column when none is named)."""
        return self.first_pass_columns(options)

    first_pass_desc: ClassVar[str | None] = None
    """Names the first pass's progress bar ("lengths": `bucket: lengths`); None shows none."""

    def first_pass(self, options: O, context: Context, chunk: Chunk) -> Any:
        """One chunk's statistics: a Tally, or any object with `merge(later)` that `new_stats` makes."""
        raise NotImplementedError(f"{self.name} has no first pass")

    def new_stats(self, options: O) -> Any:
        """The statistics of no rows that the first pass's (or the dry-run pass's) chunks are merged into."""
        return Tally()

    def first_pass_depends(self, options: O) -> Depends:
        """What the first pass depends on besides the rows (ORDER: a shuffle before it in a pipeline must run)."""
        return Depends.ROWS

    def plan(self, options: O, context: Context, stats: Tally | None) -> P:
        """What the kernel needs, from the options and the first pass's merged statistics (None: no pass)."""
        return options  # type: ignore[return-value]

    def per_chunk(self, plan: P) -> Callable[[Chunk], P] | None:
        """For a plan that changes chunk by chunk in input order (a running estimate): a function the driver
        calls with each chunk, in order, for that chunk's plan. None: one plan for all."""
        return None

    # -- the work
    def kernel(self, plan: P, chunk: Chunk) -> tuple[Any, Tally]:
        """One chunk's output (a Chunk, or what `pieces` cuts if `expands`) and statistics; pure: it runs on
        any worker, in any order, and changes nothing it did not make."""
        raise NotImplementedError

    def pieces(self, output: Any) -> Iterable[Any]:
        raise NotImplementedError(f"{self.name} does not expand")

    def build(self, plan: P, piece: Any) -> tuple[Chunk, int]:
        """A piece's rows, and the input rows it completes."""
        raise NotImplementedError(f"{self.name} does not expand")

    def regroup(self, plan: P, data: Dataset, report: ReadReport,
                runtime: Runtime) -> AbstractContextManager[Regrouped]:
        """Kind.REORDERS and Kind.BATCHES instead of `kernel`: read all of `data` (counting skipped records in
        `report`), spill it (under the options' memory and tmp_dir) and give the output back in its new order
        and grouping; the spill lives until the context closes. The driver writes the output, or a pipeline
        streams it on."""
        raise NotImplementedError(f"{self.name} does not regroup")

    def exchange(self, plan: P, data: Dataset, probe: Probe) -> Exchange | None:
        """`regroup` as map-reduce on a remote engine's workers, which the driver runs instead for a command with
        --engine ray and DST a path; None (the default): regroup on the driver. `probe(measure)` is measure of
        the first chunk, computed on a worker."""
        return None

    def on_stream_error(self, plan: P, error: BatchtoolError, scan: Scan) -> BatchtoolError | None:
        """An error raised while the input streams through the kernel or `regroup` (found mid-stream, so it
        may only know part of the input): the error to raise instead (`scan` runs passes over the whole
        input), or None to raise it as it is. The driver and the pipeline stage call it for every stream."""
        return None

    # -- what it says
    def report(self, plan: P, stats: Tally) -> dict[str, Any]:
        """The manifest's statistics from the kernels' merged ones."""
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in stats.counts.items()}

    def expected(self, plan: P, rows_in: int | None, stats: Any = None) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing. `stats`:
        the dry-run pass's merged statistics (`dry_run_columns`), None for an op without one."""
        return None, {}

    def said(self, stats: dict[str, Any]) -> list[str]:
        """Lines printed from its statistics (the manifest's, or its pipeline stage's) before the report every
        command ends with; a line starting with "warning: " is printed even with --quiet, and is the only kind
        `run` prints (its table says the rest). A line naming the op names it as `who(stats, self.name)`."""
        return []

    def noted(self, stats: dict[str, Any]) -> list[str]:
        """Its own words at the end of the one-line summary of what it did (a run's or a dry run's stage), after
        the numbers the summary reads from statistics every op may have."""
        return []

    # -- dry run (optional): a pass only --dry-run makes, for what `expected` says
    def dry_run_columns(self, options: O) -> list[str]:
        """The columns of an extra pass a dry run makes for `expected`; [] when it has none."""
        return []

    def dry_run_pass(self, options: O, chunk: Chunk) -> Any:
        """One chunk's statistics for the dry run: an object with `merge(later)`, merged in input order."""
        raise NotImplementedError(f"{self.name} has no dry-run pass")


def need_columns(schema: pa.Schema, field: str, names: Sequence[str]) -> None:
    """A ColumnError naming the field for the first of `names` that the schema lacks."""
    for name in names:
        if name not in schema.names:
            raise ColumnError(field, f"no column {name!r} in the input (columns: {', '.join(schema.names)})")


def who(stats: Mapping[str, Any], name: str) -> str:
    """How a line of an op's `said` names it: by its command's name, or `stage 2 (stratify)` for a pipeline's
    stage (whose statistics carry its number)."""
    return f"stage {stats['stage']} ({name})" if "stage" in stats else name


def row_stats(rows_in: int, rows_out: int) -> Tally:
    """What every row op reports per chunk."""
    return Tally.of(rows_in=rows_in, rows_out=rows_out)


__all__ = ["Bar", "Batches", "Cut", "Exchange", "Probe", "Scatter", "Scattered", "SortedStream", "Regrouped", "Runtime", "manifest_options", "Choice", "Column", "ColumnError", "ColumnList", "Context", "Depends", "Flag", "Integer", "Kind", "Number",
           "NumberOrColumn", "Operation", "Option", "OptionError", "Pairs", "Scan", "TableError", "Tally", "TextTable", "Typed", "Value", "Wording", "build",
           "fields",
           "flag", "from_texts", "key", "need_columns", "option", "read_table", "row_stats", "shown", "suggest", "who"]
