"""What `segment` is asked to do: its options, declared once for the command line and pipeline files, with the
checks that need no data."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from batchtool.ops import names as own
from batchtool.ops.base import OptionError
from batchtool.core.options import Column, ColumnList, Flag, Integer, Pairs, option

if TYPE_CHECKING:
    import pyarrow as pa

METADATA: tuple[tuple[str, str], ...] = (
    ("key", "string"), ("next_key", "string"), ("sequence", "int32"), ("sequence_count", "int32"),
    ("length", "int32"), ("total_length", "int32"), ("insertion_index", "int64"), ("lane", "int32"),
    ("batch", "int64"))
"""The columns segment adds to every output row (tf.contrib.training.batch_sequences_with_states' metadata), by
their default names (--output-column names them otherwise), with their Arrow types' names (pyarrow.type_for_alias:
the options' module imports no pyarrow, so that --help does not)."""
OUTPUT_COLUMNS = tuple(name for name, _ in METADATA)
STEPS = ("length", "total_length")
"""Own columns that count steps: a clash with one offers --input-length."""
ADOPTED = ("length",)
"""Own columns an integer input column of the same name may already hold (each example's steps): taken, not copied
as context."""


class FlagPair(Flag):
    """On or off, in both forms: `--pad/--no-pad` on the command line, `pad = false` or `no-pad = true` in a
    pipeline file."""

    negatable = True


@dataclass(frozen=True)
class SegmentOptions:
    """What to segment and how to batch it (the flags of `batchtool segment`, the keys of a segment stage)."""

    key: str = option("Unique string key of each example (input_key).", Column())
    sequence: tuple[str, ...] = option("Sequence (list) columns sharing one time axis, split into segments "
                                       "(input_sequences).", ColumnList(dedupe=True))
    num_unroll: int = option("Steps per segment (num_unroll).", Integer())
    batch_size: int = option("Rows (lanes) per batch (batch_size).", Integer())
    context: tuple[str, ...] | None = option("Per-example columns copied to every segment (input_context).",
                                             ColumnList(dedupe=True), None)
    """None: every input column the other options do not use (see with_context)."""
    input_length: str | None = option("Integer column of real steps before padding (input_length; default: the "
                                      "sequence length).", Column(), None)
    pad: bool = option("Pad each sequence to a multiple of --num-unroll, or require one (pad).", FlagPair(), True)
    pad_value: tuple[str, ...] = option("Pad value of a sequence column (default 0, False or ''); repeatable.",
                                        Pairs("COL=V"), ())
    initial_state: tuple[str, ...] = option("Write COL's value as column NAME on each example's first segment, zeros "
                                            "on the others (initial_states); repeatable.", Pairs("NAME=COL"), ())
    allow_small_batch: bool = option("Drop the empty rows of the final batches instead of writing padding rows "
                                     "(allow_small_batch).", Flag(), False)
    world_size: int = option("Write N lane-stable streams with equal batch counts, one per training rank (read "
                             "with batchtool.load(DST, rank=r, world_size=N)).", Integer(metavar="N"), 1)
    """Lane streams written: batch t of rank r is output batch t * world_size + r."""
    output_column: tuple[tuple[str, str], ...] = own.output_column(OUTPUT_COLUMNS)
    adopted: tuple[tuple[str, str], ...] = ()
    """(own column, input column) pairs segment takes for its own instead of copying them as context: what
    `with_context` finds (an integer `length` holding each example's steps, checked as the chunks are read)."""

    def __post_init__(self) -> None:
        for name in ("num_unroll", "batch_size", "world_size"):
            if getattr(self, name) < 1:
                raise OptionError(name, "must be at least 1", value=str(getattr(self, name)))
        if not self.sequence:
            raise OptionError("sequence", "give at least one sequence (list) column")
        named = (("sequence", self.sequence), ("context", self.context or ()), ("initial_state", tuple(self.states)))
        for field, names in named:
            for name in names:
                if ":" in name:
                    raise OptionError(field, "names may not contain ':' (as in batch_sequences_with_states)",
                                      value=repr(name))
        own.check_names(OUTPUT_COLUMNS, self.output_column)
        reserved = {name: role for role, name in self.names.items()}
        seen: dict[str, str] = {}
        for field, names in named:
            for name in names:
                if name in reserved:
                    raise own.clash("segment", reserved[name], name, steps=STEPS if field == "context" else ())
                if name in seen:
                    raise OptionError(field, f"already given as {{{seen[name]}}} {name!r}; each output column must "
                                      "be named once", value=repr(name), mentions=[seen[name]])
                seen[name] = field
        for spec in self.pad_value:
            name = spec.partition("=")[0]
            if name not in self.sequence:
                raise OptionError("pad_value", f"{name!r} is not a {{sequence}} column (sequences: "
                                  f"{', '.join(self.sequence)})", value=repr(spec), mentions=["sequence"])

    @property
    def states(self) -> dict[str, str]:
        """--initial-state specs as {output name: source column}."""
        out: dict[str, str] = {}
        for spec in self.initial_state:
            name, sep, column = spec.partition("=")
            if not sep or not name or not column:
                raise OptionError("initial_state", "expected NAME=COLUMN", value=repr(spec))
            if name in out:
                raise OptionError("initial_state", f"state {name!r} is given twice", value=repr(spec))
            out[name] = column
        return out

    @property
    def names(self) -> dict[str, str]:
        """Each own column's name (--output-column)."""
        return own.named(OUTPUT_COLUMNS, self.output_column)

    def with_context(self, schema: pa.Schema) -> SegmentOptions:
        """Without --context, every input column neither used otherwise (key, sequences, --input-length,
        --initial-state sources) nor adopted (`adopted`) is context, so no column is dropped unasked; one that
        would clash with an output column is refused by name."""
        if self.context is not None:
            return self
        used = {self.key, *self.sequence, *self.states.values(), self.input_length}
        adopted = {role: column for role, column in own.adopted(schema, self.names, ADOPTED).items()
                   if column not in used}
        rest = tuple(name for name in schema.names if name not in used and name not in adopted.values())
        own.refuse_clashes("segment", self.names, rest, steps=STEPS,
                           also=", or name the columns to copy with {context}")
        states = [name for name in rest if name in self.states]
        if states:
            raise OptionError("initial_state", f"input column {states[0]!r} would be copied as context but is also "
                              "the name of a state; name the state otherwise, or name the columns to copy with "
                              "{context}", mentions=["context"])
        return replace(self, context=rest, adopted=tuple(adopted.items()))

    @property
    def source_columns(self) -> list[str]:
        """The input columns to read, each once (the options with their context resolved, and the adopted ones)."""
        assert self.context is not None, "source_columns of options with their context resolved"
        cols = [self.key, *self.context, *self.sequence, *self.states.values(), *(c for _, c in self.adopted)]
        if self.input_length:
            cols.append(self.input_length)
        return list(dict.fromkeys(cols))

    def manifest_options(self) -> dict[str, Any]:
        """The manifest's options (named as they always were: sequences, pad_values, initial_states)."""
        return {"key": self.key, "sequences": list(self.sequence), "num_unroll": self.num_unroll,
                "batch_size": self.batch_size, "context": list(self.context or ()), "input_length": self.input_length,
                "pad": self.pad, "pad_values": list(self.pad_value), "initial_states": self.states,
                "allow_small_batch": self.allow_small_batch, "world_size": self.world_size,
                **own.recorded(self.output_column)}


__all__ = ["ADOPTED", "METADATA", "OUTPUT_COLUMNS", "STEPS", "FlagPair", "SegmentOptions"]
