"""What `pack` is asked to do: its options (declared once for the command line and pipeline files), which
input columns play which part, and the schema it writes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from batchtool.ops import names as own
from batchtool.ops.base import ColumnError, OptionError, need_columns
from batchtool.core.options import Choice, ColumnList, Flag, Integer, Pairs, Value, option, shown

if TYPE_CHECKING:  # arrays are imported where the functions run: options declared from here make --help
    import pyarrow as pa

    from batchtool.ops.batching import BatchBudget

PER_STEP = ("segment_ids", "positions")
PER_ROW = ("cu_seqlens", "num_examples", "length", "batch")
SOURCE_OFFSET = "source_offset"
"""With --split-long: per packed example, the step of its source example where the piece starts."""
CU_UNPADDED = "cu_seqlens_unpadded"
"""With --segment-multiple: per row, the cumulative real lengths of its pieces (cu_seqlens holds where each piece
starts, its padding included), as Megatron's packed sequences carry them beside cu_seqlens."""
OUTPUT_COLUMNS = (*PER_STEP, *PER_ROW, SOURCE_OFFSET, CU_UNPADDED)
"""pack's own columns, each renamable with --output-column."""
ADOPTED = ("length",)
"""Own columns an integer input column of the same name may already hold (each example's steps): taken, not
written twice."""
MAX_LENGTH_LIMIT = 1 << 22
"""--max-length at most this (4M steps): planning holds counts per length up to max_length, 8 bytes each."""
DEFAULT_BATCH_SIZE = 8
"""Rows per batch when neither --batch-size nor --max-tokens is given: Hugging Face Trainer's default
per_device_train_batch_size, so a batch is what a trainer of packed rows takes by default (8 x L steps)."""
BALANCES = {"attention": None, "tokens": (0.0, 1.0)}
"""--balance: the cost of a document piece of L steps, a x L^2 + b x L, with (a, b) fixed for `tokens` and taken from
--cost-coefficients (default 1,0) for `attention`."""
DEFAULT_COEFFICIENTS = (1.0, 0.0)


class PieceCost(Value):
    """Two non-negative numbers a,b, not both 0 (a TOML array of two numbers, or the text "a,b")."""

    metavar = "A,B"

    def from_text(self, field: str, text: Any) -> Any:
        parts = str(text).split(",")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(parts) != 2 or len(values) != 2:
            raise OptionError(field, "expected two numbers A,B (the cost A x L^2 + B x L of a document piece of L "
                              "steps)", value=repr(text))
        return values

    def parse(self, field: str, value: Any) -> tuple[float, float]:
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise OptionError(field, f"expected two numbers A,B, got {shown(value)}")
        a, b = (float(v) for v in value)
        if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0 and a + b > 0):
            raise OptionError(field, "must be finite, at least 0 and not both 0", value=f"{a:g},{b:g}")
        return a, b


@dataclass(frozen=True)
class PackOptions:
    """What `pack` computes; validated on construction."""

    max_length: int = option("Steps per packed row, at most.", Integer(metavar="L"))
    sequence: tuple[str, ...] | None = option(
        "A sequence (list) column to pack; repeat for several, which must agree in length (default: every list "
        "column).", ColumnList(), None)
    columns: tuple[str, ...] | None = option(
        "Keep only these columns besides the packed sequences, as per-example lists (default: every column).",
        ColumnList(), None)
    max_examples_per_row: int | None = option("At most K examples in a row (never more than L).",
                                              Integer(metavar="K"), None)
    max_segments: int | None = option(
        "At most K examples (or pieces) in a row, and cu_seqlens of exactly K + 1 offsets per row, the last one "
        "repeated (one shape for CUDA graphs); K at most L.", Integer(metavar="K"), None)
    segment_multiple: int | None = option(
        "Every example (or piece) takes a multiple of M steps in its row, padded at its end (for context "
        "parallelism: M = 2 x the context-parallel size); L must be a multiple of M.", Integer(metavar="M"), None)
    split_long: bool = option("Cut examples longer than L into pieces of at most L steps (marked in source_offset).",
                              Flag(), False)
    drop_long: bool = option("Drop (and count) examples longer than L.", Flag(), False)
    batch_size: int | None = option(f"Packed rows per batch (default {DEFAULT_BATCH_SIZE} without --max-tokens, as "
                                    "Hugging Face Trainer's per_device_train_batch_size).", Integer(metavar="B"), None)
    max_tokens: int | None = option("Instead of --batch-size: at most T padded steps (rows x padded length) per "
                                    "batch.", Integer(metavar="T"), None)
    pad_to_max_length: bool = option("Pad every batch to L steps (default: to the batch's longest row).", Flag(),
                                     False)
    pad_value: tuple[str, ...] | None = option("Pad value of a sequence column (default 0, '' for strings); "
                                               "repeatable.", Pairs("COL=V"), None)
    world_size: int | None = option("Lay the batches out for N ranks, batch k being rank k % N's at step k // N, each "
                                    "step's rows balanced across the ranks by --balance (read with batchtool.load(DST, "
                                    "rank=r, world_size=N, shuffle=False)); rows beyond a multiple of N x B are dropped "
                                    "and counted.", Integer(metavar="N"), None)
    balance: str | None = option("With --world-size, what each rank's rows should cost alike at every step: "
                                 "attention (a x L^2 + b x L per document piece of L steps, --cost-coefficients) or "
                                 "tokens (L) (default attention).", Choice(tuple(BALANCES)), None)
    cost_coefficients: tuple[float, float] | None = option(
        "With --balance attention: a,b of the cost a x L^2 + b x L of a document piece of L steps (default 1,0).",
        PieceCost(), None)
    output_column: tuple[tuple[str, str], ...] = own.output_column(OUTPUT_COLUMNS)

    def __post_init__(self) -> None:
        from batchtool.io.padding import MAX_PADDED_STEPS

        L = self.max_length
        if not 1 <= L <= MAX_LENGTH_LIMIT:
            raise OptionError("max_length", f"must be between 1 and {MAX_LENGTH_LIMIT:,}", value=str(L))
        K = self.max_examples_per_row
        if K is not None and K < 1:
            raise OptionError("max_examples_per_row", "must be at least 1", value=str(K))
        self._check_segments()
        if self.split_long and self.drop_long:
            raise OptionError("drop_long", "give at most one of {split_long} and {drop_long}", mentions=["split_long"])
        if self.batch_size is not None and self.max_tokens is not None:
            raise OptionError("batch_size", "give at most one of {batch_size} and {max_tokens}",
                              mentions=["max_tokens"])
        if self.max_tokens is None and self.batch_size is None:  # frozen: the default is settled once, here
            object.__setattr__(self, "batch_size", DEFAULT_BATCH_SIZE)
        if self.batch_size is not None:
            if self.batch_size < 1:
                raise OptionError("batch_size", "must be positive", value=str(self.batch_size))
            if self.pad_to_max_length and self.batch_size * L > MAX_PADDED_STEPS:
                raise OptionError("batch_size", f"{{batch_size}} {self.batch_size} x {{max_length}} {L} padded steps "
                                  f"exceed {MAX_PADDED_STEPS:,} (the most an Arrow list column holds); use a smaller "
                                  "batch", mentions=["max_length"])
        if self.max_tokens is not None and not L <= self.max_tokens <= MAX_PADDED_STEPS:
            raise OptionError("max_tokens", f"must be between {{max_length}} ({L}, so that a full row fits) and "
                              f"{MAX_PADDED_STEPS:,}", value=str(self.max_tokens), mentions=["max_length"])
        own.check_names(OUTPUT_COLUMNS, self.output_column)
        self._check_ranks()

    def _check_segments(self) -> None:
        """--segment-multiple M divides L (so that padded pieces fill a row exactly); --max-segments K is at most L
        (a row holds at most L examples, and K sizes every row's cu_seqlens) and replaces --max-examples-per-row."""
        M, K, L = self.segment_multiple, self.max_segments, self.max_length
        if M is not None:
            if M < 1:
                raise OptionError("segment_multiple", "must be at least 1", value=str(M))
            if L % M:
                raise OptionError("max_length", f"must be a multiple of {{segment_multiple}} {M}", value=str(L),
                                  mentions=["segment_multiple"])
        if K is not None:
            if not 1 <= K <= L:
                raise OptionError("max_segments", f"must be between 1 and {{max_length}} ({L})", value=str(K),
                                  mentions=["max_length"])
            if self.max_examples_per_row is not None:
                raise OptionError("max_segments", "give at most one of {max_examples_per_row} and {max_segments} "
                                  "({max_segments} bounds the examples per row too)",
                                  mentions=["max_examples_per_row"])

    def _check_ranks(self) -> None:
        """--world-size needs a fixed --batch-size (every rank's batch at a step holds as many rows); --balance and
        --cost-coefficients mean something only with it."""
        if self.world_size is None:
            for name in ("balance", "cost_coefficients"):
                if getattr(self, name) is not None:
                    raise OptionError(name, f"{{{name}}} balances ranks: give it with {{world_size}} N",
                                      mentions=["world_size"])
            return
        if self.world_size < 1:
            raise OptionError("world_size", "must be at least 1", value=str(self.world_size))
        if self.max_tokens is not None:
            raise OptionError("max_tokens", "give {batch_size} with {world_size}: every rank's batch at a step holds "
                              "as many rows", mentions=["batch_size", "world_size"])
        if self.balance == "tokens" and self.cost_coefficients is not None:
            raise OptionError("cost_coefficients", "{cost_coefficients} weighs {balance} attention; "
                              "{balance} tokens counts steps", mentions=["balance"])

    @property
    def coefficients(self) -> tuple[float, float]:
        """(a, b) of a document piece's cost a x L^2 + b x L, for --balance."""
        return BALANCES[self.balance or "attention"] or self.cost_coefficients or DEFAULT_COEFFICIENTS

    @property
    def names(self) -> dict[str, str]:
        """Each own column's name (--output-column)."""
        return own.named(OUTPUT_COLUMNS, self.output_column)

    @property
    def row_examples(self) -> int:
        """The most examples a row holds: --max-examples-per-row or --max-segments, and never more than L (which
        binds only for examples of 0 steps), so that step_type holds every segment id."""
        return min(self.max_segments or self.max_examples_per_row or self.max_length, self.max_length)

    @property
    def multiple(self) -> int:
        """The steps every piece's span in its row is a multiple of (1 without --segment-multiple)."""
        return self.segment_multiple or 1

    @property
    def long(self) -> str:
        """What happens to an example longer than max_length: "error" (stop the run), "split" or "drop"."""
        return "split" if self.split_long else "drop" if self.drop_long else "error"

    @property
    def sequences(self) -> tuple[str, ...]:
        """The sequence columns named (none: every list column)."""
        return self.sequence or ()

    @property
    def pad_values(self) -> tuple[str, ...]:
        return self.pad_value or ()

    @property
    def budget(self) -> BatchBudget:
        from batchtool.ops.batching import BatchBudget

        return BatchBudget(batch_size=self.batch_size, max_tokens=self.max_tokens)

    def recorded(self) -> dict[str, Any]:
        """The manifest's options (as they were before the options had a schema: `long` one word)."""
        return {"max_length": self.max_length, "sequences": self.sequences,
                "max_examples_per_row": self.max_examples_per_row, "long": self.long, "batch_size": self.batch_size,
                "max_tokens": self.max_tokens, "pad_to_max_length": self.pad_to_max_length,
                "pad_values": self.pad_values, **({"columns": self.columns} if self.columns is not None else {}),
                **own.recorded(self.output_column), **self._recorded_ranks(),
                **{k: v for k, v in (("segment_multiple", self.segment_multiple),
                                     ("max_segments", self.max_segments)) if v is not None}}

    def _recorded_ranks(self) -> dict[str, Any]:
        """--world-size and its balance, recorded only when given (so older outputs keep their manifests)."""
        if self.world_size is None:
            return {}
        return {"world_size": self.world_size, "balance": self.balance or "attention",
                "cost_coefficients": list(self.coefficients)}


@dataclass(frozen=True)
class PackColumns:
    """Which input columns play which part; resolved from the schema before the first pass."""

    sequences: tuple[str, ...]
    """List columns concatenated into packed rows; they must agree in length row by row."""
    others: tuple[str, ...]
    """Every other column, written as a list of one value per packed example."""
    defaulted: bool = False
    names: Mapping[str, str] = field(default_factory=lambda: own.named(OUTPUT_COLUMNS, ()))
    """Each own column's name."""
    adopted: Mapping[str, str] = field(default_factory=dict)
    """{own column: input column} an integer input column holds already (its name): checked in the first pass to
    hold each example's steps, then not written twice."""

    @property
    def length(self) -> str:
        return self.sequences[0]

    @property
    def dropped(self) -> tuple[str, ...]:
        """Adopted input columns: checked in the first pass, not written (pack writes its own)."""
        return tuple(self.adopted.values())

    def kept(self, schema: pa.Schema) -> list[str]:
        """The input columns packed or carried, in the input's order: the second pass reads only these."""
        return [n for n in schema.names if n in self.sequences or n in self.others]


def resolve_columns(options: PackOptions, schema: pa.Schema) -> PackColumns:
    """Check the named sequence columns (default: every list column), and that no input column it writes is named
    like one of its own columns (one that holds each example's steps is adopted instead, see PackColumns)."""
    from batchtool.io.padding import parse_pad_values
    from batchtool.io.stats import is_sequence_type

    names = schema.names
    for name in options.sequences:
        if name not in names:
            raise ColumnError("sequence", f"no such column (available: {', '.join(names)})", value=name)
        if not is_sequence_type(schema.field(name).type):
            raise ColumnError("sequence", f"column is {schema.field(name).type}, expected a list (sequence) column",
                              value=name)
    need_columns(schema, "columns", options.columns or ())
    sequences = options.sequences or tuple(f.name for f in schema if is_sequence_type(f.type))
    if not sequences:
        raise ColumnError("sequence", "no list column to pack: pass {sequence} COL")
    kept = [n for n in names if n in sequences or options.columns is None or n in options.columns]
    out = options.names
    written = {role: out[role] for role in OUTPUT_COLUMNS if written_role(role, options)}
    adopted = {role: column for role, column in own.adopted(schema, out, ADOPTED).items()
               if column in kept and column not in sequences}
    own.refuse_clashes("pack", written, [n for n in kept if n not in adopted.values()])
    unpadded = sorted(set(parse_pad_values(options.pad_values, schema)) - set(sequences))
    if unpadded:
        raise ColumnError("pad_value", f"{{pad_value}} {unpadded[0]}=...: column {unpadded[0]!r} is not packed "
                          f"(sequence columns: {', '.join(sequences)})")
    others = tuple(n for n in kept if n not in sequences and n not in adopted.values())
    return PackColumns(tuple(sequences), others, defaulted=not options.sequences, names=out, adopted=adopted)


def output_schema(schema: pa.Schema, columns: PackColumns, options: PackOptions) -> pa.Schema:
    """Input columns in their order (sequences packed, the others as per-example lists), then the
    packing columns."""
    import pyarrow as pa

    out = columns.names
    kept = columns.kept(schema)
    fields = [pa.field(f.name, pa.list_(f.type.value_field) if f.name in columns.sequences else pa.list_(f.type),
                       metadata=f.metadata) for f in schema if f.name in kept]
    if options.long == "split":
        fields.append(pa.field(out[SOURCE_OFFSET], pa.list_(pa.int32())))
    fields += [pa.field(out[name], pa.list_(step_type(options.max_length))) for name in PER_STEP]
    fields += [pa.field(out[name], pa.list_(pa.int32()))  # int32, as flash-attn's varlen kernels take it
               for name in ("cu_seqlens", CU_UNPADDED) if written_role(name, options)]
    fields += [pa.field(out["num_examples"], pa.int32()), pa.field(out["length"], pa.int32()),
               pa.field(out["batch"], pa.int64())]
    return pa.schema(fields, metadata=schema.metadata)


def written_role(role: str, options: PackOptions) -> bool:
    """Whether pack writes its own column `role`: source_offset only with --split-long, cu_seqlens_unpadded only
    with --segment-multiple."""
    return {SOURCE_OFFSET: options.long == "split", CU_UNPADDED: options.segment_multiple is not None}.get(role, True)


def step_type(max_length: int) -> pa.DataType:
    """segment_ids' and positions' type: the smallest signed integer that holds --max-length (a position is below L,
    and a row holds at most L examples, PackOptions.row_examples), so they cost 1 or 2 bytes a step instead of 4.
    Signed because their consumers index with them: PyTorch indexes with signed integers (a uint8 tensor indexes as a
    boolean mask) and NumPy, PyTorch and JAX widen a signed one with int32/int64 to a signed one."""
    import numpy as np
    import pyarrow as pa

    for t in (pa.int8(), pa.int16()):
        if max_length <= np.iinfo(t.to_pandas_dtype()).max:
            return t
    return pa.int32()


def feature_lists(schema: pa.Schema, columns: PackColumns) -> tuple[str, ...]:
    """Columns written as SequenceExample feature lists: the per-step ones, and per-example lists of lists
    (which a context feature cannot hold); the other per-example and per-row lists are context features."""
    from batchtool.io.stats import is_sequence_type

    nested = tuple(f.name for f in schema if f.name in columns.others and is_sequence_type(f.type.value_type))
    return (*columns.sequences, *(columns.names[c] for c in PER_STEP), *nested)


__all__ = ["ADOPTED", "BALANCES", "CU_UNPADDED", "PieceCost", "DEFAULT_BATCH_SIZE", "DEFAULT_COEFFICIENTS", "MAX_LENGTH_LIMIT",
           "OUTPUT_COLUMNS", "PER_ROW",
           "PER_STEP", "SOURCE_OFFSET", "PackColumns", "PackOptions", "feature_lists", "output_schema", "resolve_columns",
           "step_type", "written_role"]
