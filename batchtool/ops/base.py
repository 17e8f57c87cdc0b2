"""The operation interface: one definition per op, from which its command, its pipeline stage and its dry run are derived.

An op is declared (`Declaration`: its name, help, options and kind, in a module that imports no kernel, which its command
and pipeline stage are made from) and run by a subclass of `Operation` that takes that declaration; both are registered
in batchtool.ops (DECLARATIONS, OPERATIONS). It declares its options as
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
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from batchtool.core.budget import DEFAULT_MEMORY
from batchtool.core.errors import OptionError, SchemaError

if TYPE_CHECKING:  # (the interface alone imports no kernel: an op's --help is made from its definition)
    import pyarrow as pa

    from batchtool.core.tally import Tally
    from batchtool.io.dataset import Chunk
    from batchtool.io.output import OutputOptions
    from batchtool.ops.regroup import Exchange, Input, Probe, Stream

O = TypeVar("O")
"""An op's options (its frozen dataclass)."""
P = TypeVar("P")
"""An op's plan (its options when it has no first pass)."""
Columns = list[str] | None
"""Column names, or None for all of them."""
Scan = Callable[[list[str], Callable[["Chunk"], Any]], Iterator[Any]]
"""A pass over some columns of the input: fn(chunk) per chunk, in input order (see Context.scan)."""


class Kind(enum.Enum):
    """What an op does to the order and grouping of rows (what may come after it in a pipeline)."""

    ROWS = "rows"
    """Maps each chunk on its own; order and chunking are kept."""
    REORDERS = "reorders"
    """Reorders rows globally (spills before it emits)."""
    BATCHES = "batches"
    """Writes batches a later op would regroup: it must come last."""


class OutputRows(enum.Enum):
    """What a row of an op's output is, for those who read the output back (inspect, batchtool.load): its manifest
    records the op, the op declares this (Operation.output_rows), so no reader branches on an op's name."""

    EXAMPLES = "examples"
    """One input example, as it was or resampled, renamed, reordered or batched."""
    PADDED = "padded"
    """One example padded to its batch's length, its real length in the op's `length` column (bucket)."""
    PACKED = "packed"
    """Whole examples packed into one row: the row's real steps in `length`, each example's by `cu_seqlens` (pack)."""
    SEGMENTS = "segments"
    """One segment of an example in a lane whose state carries from batch to batch (segment): the batches continue
    each other, so they are read in order and no lane is split across ranks."""


class ColumnError(OptionError, SchemaError):
    """An option names a column the input lacks, or one whose type it cannot use."""


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
    memory: int = DEFAULT_MEMORY
    """--memory: what the op may hold at once (its spill's key ranges, a batch, a buffer), checked before it is
    allocated (batchtool.core.budget)."""
    tasks: int = 1
    """Tasks one process runs at once (runner.Shares.tasks_per_process: the local engine's threads; 1 where each
    worker is a process of its own): each sorts a key range of its own, so a range's share of --memory shrinks with
    them (ops.keyed.range_bytes)."""


@dataclass(frozen=True)
class Shape:
    """What an op is with given options: its kind, and what its output depends on besides the rows it reads."""

    kind: Kind
    depends: Depends


@dataclass(frozen=True)
class Said:
    """What an op says of a run from its statistics, besides the numbers every summary reads."""

    lines: tuple[str, ...] = ()
    """Printed before the summary every command ends with; a line starting with "warning: " is printed even with
    --quiet, and is the only kind `run` prints (its table says the rest). A line naming the op names it as
    `who(stats, op.name)`."""
    note: tuple[str, ...] = ()
    """Its own words at the end of the one-line summary (a run's, or a dry run's stage)."""


def manifest_options(options: Any, output: OutputOptions) -> dict[str, Any]:
    """The options a manifest records: the operation's dataclass plus the output settings."""
    return {**dataclasses.asdict(options), "to": output.format, "compression": output.codec,
            "shard_rows": output.shard_rows, "shard_bytes": output.shard_bytes}


S = TypeVar("S")
"""A pass's statistics: any object with `merge(later)`."""


@dataclass(frozen=True)
class Pass(Generic[S]):
    """A pass an op makes over some columns of its input before its work (its first pass, which its plan is made
    from; its dry run's preview): each chunk's statistics, computed on the engine and merged in input order into
    what `new` makes."""

    columns: list[str]
    new: Callable[[], S]
    """The statistics of no rows."""
    of: Callable[[Context, Chunk], S]
    """One chunk's statistics (pure: it runs on any worker)."""
    desc: str | None = None
    """Names its progress bar (`bucket: lengths`); None shows none."""
    depends: Depends = Depends.ROWS
    """What it depends on besides the rows (ORDER: a shuffle before it in a pipeline must really run)."""


class Expanding(ABC):
    """A kernel's output that may outgrow its input chunk (copies of its rows): the writer builds its pieces, each
    of bounded bytes, one at a time where it wants them, so that no chunk decides memory."""

    @abstractmethod
    def pieces(self) -> Iterator[Piece]: ...


class Piece(Protocol):
    """Part of an Expanding output: its rows once built, and the input rows it completes."""

    rows: int

    def build(self) -> Chunk: ...


@dataclass(frozen=True)
class Declaration(Generic[O]):
    """What an op is before it runs, importing none of its kernels: its command, its pipeline stage and their checks
    are made from it (`--help` reads it alone), and its Operation takes its attributes of the same names
    (`class SegmentOp(Operation, declared=DECLARED)`)."""

    name: str
    summary: str
    """What the command does (its --help starts with this)."""
    example: str
    """A command line that runs as written on sample_data/ (its --help ends with it)."""
    options: type[O]
    kind: Kind = Kind.ROWS
    seeded: bool = False
    """Takes a --seed (random draws keyed by it and the example ids)."""
    spills: tuple[str, ...] = ()
    """It spills (it takes --memory and --tmp-dir; a pipeline's own in a pipeline): the run settings its manifest's
    options record besides its own (RunSettings.recorded)."""
    batches_flag: str | bool | None = None
    """The flag with which its output is batches (written as batch shards without --to); True: always batches."""
    reorder_selects: bool = False
    """A reorder (Kind.REORDERS) whose kernel also selects rows (mix): a pipeline's pass that needs only the rows runs
    the kernel as they stream instead of skipping the reorder, as it may skip a shuffle."""
    output_rows: OutputRows = OutputRows.EXAMPLES
    """What a row of its output is (what inspect and batchtool.load make of an output its manifest says it wrote)."""
    several_sources: bool = False
    """It reads several SRCs as one dataset (batchtool.io.mixed: each row's source in a column of its own): its command
    (`NAME SRC SRC ... DST`) and its place in a pipeline (an [input] of several paths) are its own."""
    shaped: Callable[[O], Shape] | None = None
    """Its Shape from its options, where they change it (stratify makes batches only with --batch-size); None: its
    kind, depending on the rows' order if it is seeded."""

    def shape(self, options: O) -> Shape:
        """Its kind with these options, and what its output depends on besides the rows (a pipeline keeps it intact)."""
        if self.shaped is not None:
            return self.shaped(options)
        return Shape(self.kind, Depends.ORDER if self.seeded else Depends.ROWS)

    def writes_batches(self, options: O) -> bool:
        """Its output is batches with these options (each stored batch one training batch), not rows in row groups."""
        return self.shape(options).kind is Kind.BATCHES


class Operation(Generic[O, P]):
    """One operation: its declaration (`declared=`, its name, options, kind, ...), its `output_schema` and `kernel`
    (or `regroup`). Every other hook has a default for an op with no first pass, one plan for every chunk, and
    output no larger than its input."""

    declared: ClassVar[Declaration]
    name: ClassVar[str]
    summary: ClassVar[str]
    example: ClassVar[str]
    options: ClassVar[type]
    kind: ClassVar[Kind]
    seeded: ClassVar[bool]
    spills: ClassVar[tuple[str, ...]]
    batches_flag: ClassVar[str | bool | None]
    reorder_selects: ClassVar[bool]
    output_rows: ClassVar[OutputRows]
    several_sources: ClassVar[bool]

    def __init_subclass__(cls, declared: Declaration | None = None, **kwargs: Any) -> None:
        """`class SegmentOp(Operation, declared=DECLARED)`: its name, options, kind, ... from its declaration (the
        light module batchtool.ops.DECLARATIONS names), which --help and pipeline files read without this module."""
        super().__init_subclass__(**kwargs)
        if declared is not None:
            cls.declared = declared
            for name in ("name", "summary", "example", "options", "kind", "seeded", "spills", "batches_flag",
                         "reorder_selects", "output_rows", "several_sources"):
                setattr(cls, name, getattr(declared, name))

    # -- what it reads and writes
    def output_schema(self, options: O, schema: pa.Schema) -> pa.Schema:
        """The schema it writes given the one it reads; an OptionError for a missing or unusable column."""
        raise NotImplementedError

    def input_columns(self, options: O, columns: Columns) -> Columns:
        """The input columns needed for these output columns and its decisions (None: all)."""
        return columns

    def recorded(self, options: O, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        """What the manifest's `options` records of a run on an input of this schema."""
        return manifest_options(options, output)

    def shape(self, options: O) -> Shape:
        return self.declared.shape(options)

    def writes_batches(self, options: O) -> bool:
        return self.declared.writes_batches(options)

    # -- what it learns first, and its plan
    def first_pass(self, options: O, schema: pa.Schema) -> Pass | None:
        """The pass its plan is made from over an input of this schema; None: it has none."""
        return None

    def plan(self, options: O, context: Context, stats: Any) -> P:
        """What the kernel needs, from the options and the first pass's merged statistics (None: no pass)."""
        return options  # type: ignore[return-value]

    def per_chunk(self, plan: P) -> Callable[[Chunk], P] | None:
        """For a plan that changes chunk by chunk in input order (a running estimate): a function the driver
        calls with each chunk, in order, for that chunk's plan. None: one plan for all."""
        return None

    # -- the work
    def kernel(self, plan: P, chunk: Chunk) -> tuple[Chunk | Expanding, Tally]:
        """One chunk's output and statistics, for an op of Kind.ROWS; pure: it runs on any worker, in any order,
        and changes nothing it did not make."""
        raise NotImplementedError

    def regroup(self, plan: P, input: Input, probe: Probe) -> Exchange | Stream:
        """For an op that regroups its whole input (Kind.REORDERS, Kind.BATCHES) instead of `kernel`: its exchange
        (batchtool.exec.exchange runs it on the engine's workers), or, when its order depends on every row before
        (the buffered shuffle, lanes), the stream of items it makes from the rows the driver feeds it (Runtime.rows,
        Runtime.map_rows). It never reads the input itself: `input` says what is known before a row is read, and
        `probe(measure)` is measure of the input's first chunk, computed where it is read."""
        raise NotImplementedError(f"{self.name} does not regroup")

    # -- what it says
    def report(self, plan: P, stats: Tally) -> dict[str, Any]:
        """The manifest's statistics from the kernels' merged ones."""
        import numpy as np

        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in stats.counts.items()}

    def expected(self, plan: P, rows_in: int | None, scan: Scan) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the output rows if the plan fixes them, and what else it can say without writing (`scan` runs
        a pass over some columns of the input, for what the plan does not know)."""
        return None, {}

    def said(self, stats: dict[str, Any]) -> Said:
        """What it says from its statistics (the manifest's, or its pipeline stage's)."""
        return Said()


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
    from batchtool.core.tally import Tally

    return Tally.of(rows_in=rows_in, rows_out=rows_out)


__all__ = ["Declaration", "Expanding", "Pass", "Piece", "Said", "Shape", "ColumnError", "Context", "Depends", "Kind", "Operation", "OptionError", "OutputRows", "Scan", "manifest_options", "need_columns", "row_stats", "who"]
