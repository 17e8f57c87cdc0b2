"""Padding on load (`bucket --padding on-load`): what the manifest records of it, and each stored batch padded as
batchtool.load and batchtool.source read it, to exactly the arrays a padded output would give."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from batchtool.core.errors import BatchtoolError, InputError
from batchtool.io.padding import MAX_PADDED_STEPS, default_pad, mask_column, pad_batch, parse_pad_values, row_lengths
from batchtool.io.stats import is_sequence_type

if TYPE_CHECKING:
    from batchtool.io.dataset import Dataset

MAX_PADDED_BYTES = 512 << 20
"""The most one batch padded on load may take (its padded sequence columns): the padded length comes from the
manifest, which a damaged or hostile one could make any size, so it is checked against this before anything is
allocated. A training batch comes nowhere near (32 rows of 8,192 steps of 64 floats are 64 MiB)."""
READ_AHEAD_PADDED_BYTES = 256 << 20
"""The most the batches padded ahead of the training loop (by batchtool.load's reading threads) take together:
with one batch at most MAX_PADDED_BYTES, padded where it is handed out, a loader's padded batches never take
more than the two together, whatever the manifest says."""


def spec(sequences: Sequence[str], pad_values: Sequence[str], pad_to: Sequence[int | None], length: str,
         bucket: str, mask: str | None) -> dict[str, Any]:
    """The manifest's output.padding: the sequence columns, their --pad-value specs, each bucket's padded length
    (None: the batch's longest row), the columns holding each row's length and the batch's bucket, and the mask
    column to add (None: none)."""
    return {"sequences": list(sequences), "pad_values": list(pad_values), "pad_to": list(pad_to),
            "length": length, "bucket": bucket, "mask": mask}


@dataclass(frozen=True)
class LoadPadding:
    """How a loader pads the stored batches of one output (from its manifest, checked against its schema)."""

    sequences: tuple[str, ...]
    pad_values: dict[str, Any]
    pad_to: tuple[int | None, ...]
    length: str
    bucket: str
    mask: str | None

    @staticmethod
    def of(recorded: Any, stored: pa.Schema, path: str) -> LoadPadding:
        """The manifest's output.padding (`recorded`), or an InputError naming the field that a reader cannot
        trust: every column it names exists with the type padding needs."""
        def refuse(field: str, value: Any, expected: str) -> InputError:
            return InputError(f"{path}: output.padding.{field} is {value!r:.60}, expected {expected}")

        if not isinstance(recorded, dict):
            raise InputError(f"{path}: output.padding is {recorded!r:.60}, expected an object")
        names = stored.names
        sequences = recorded.get("sequences")
        if not (isinstance(sequences, list) and all(isinstance(s, str) and s in names
                                                    and is_sequence_type(stored.field(s).type) for s in sequences)):
            raise refuse("sequences", sequences, "a list of the output's list columns")
        for field in ("length", "bucket"):
            name = recorded.get(field)
            if not (isinstance(name, str) and name in names and pa.types.is_integer(stored.field(name).type)):
                raise refuse(field, name, "an integer column of the output")
        mask = recorded.get("mask")
        if mask is not None and (not isinstance(mask, str) or mask in names):
            raise refuse("mask", mask, "null or a column name the output does not hold")
        pad_to = recorded.get("pad_to")
        if not (isinstance(pad_to, list) and pad_to and all(
                p is None or (isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= MAX_PADDED_STEPS)
                for p in pad_to)):
            raise refuse("pad_to", pad_to, "a list of padded lengths (integers or null), one per bucket")
        specs = recorded.get("pad_values")
        if not (isinstance(specs, list) and all(isinstance(s, str) for s in specs)):
            raise refuse("pad_values", specs, "a list of COLUMN=VALUE strings")
        try:
            values = parse_pad_values(specs, stored)
        except BatchtoolError as exc:
            raise InputError(f"{path}: output.padding.pad_values: {exc}") from exc
        values = {name: values.get(name, default_pad(stored.field(name).type)) for name in sequences}
        return LoadPadding(tuple(sequences), values, tuple(pad_to), recorded["length"], recorded["bucket"], mask)

    def schema(self, stored: pa.Schema) -> pa.Schema:
        """The schema of the batches handed out: the stored one, with the mask column last if asked for."""
        return stored if self.mask is None else stored.append(pa.field(self.mask, pa.list_(pa.bool_())))

    def check_columns(self, dataset: Dataset, columns: Sequence[str] | None) -> list[str] | None:
        """The columns asked, as Dataset.check_columns gives them, the mask (not stored) among them."""
        if columns is None:
            return None
        dataset.check_columns([c for c in columns if c != self.mask])
        return list(dict.fromkeys(columns))

    def stored_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """The stored columns to read for these columns (None: all): the asked ones (less the mask) and those
        padding needs, the length and the bucket."""
        if columns is None:
            return None
        stored = [c for c in columns if c != self.mask]
        return stored + [c for c in (self.length, self.bucket) if c not in stored]

    def padded_bytes(self, batch: pa.RecordBatch, where: Callable[[], str]) -> int:
        """Bytes `batch` (read as stored_columns) takes padded, its padded sequence columns: checked as `pad`
        checks it, so nothing need be allocated to learn it."""
        return self._measure(batch, where)[2]

    def pad(self, batch: pa.RecordBatch, columns: Sequence[str] | None, where: Callable[[], str]) -> pa.RecordBatch:
        """The stored `batch` (read as stored_columns(columns)) padded as bucket would have written it, with the
        mask, in the order of `columns` (None: every column). An InputError starting with `where()` if a row's
        steps disagree with its length column, the batch's bucket is not the output's, or padded it would take more
        than MAX_PADDED_BYTES (naming the column that takes most)."""
        lengths, width, _ = self._measure(batch, where)
        sequences = [name for name in self.sequences if name in batch.schema.names]
        padded = pad_batch(batch, sequences, width, self.pad_values)
        if self.mask is not None:
            padded = padded.append_column(pa.field(self.mask, pa.list_(pa.bool_())), mask_column(lengths, width))
        return padded.select(columns if columns is not None else padded.schema.names)

    def _measure(self, batch: pa.RecordBatch, where: Callable[[], str]) -> tuple[np.ndarray, int, int]:
        """(each row's length, the padded length, the padded bytes) of a stored batch, checked."""
        lengths = batch.column(self.length).to_numpy(zero_copy_only=False).astype(np.int64)
        sequences = [name for name in self.sequences if name in batch.schema.names]
        for name in sequences:
            steps = row_lengths(batch.column(name))
            bad = np.flatnonzero(steps != lengths)
            if len(bad):
                raise InputError(f"{where()}, row {int(bad[0])}, column {name!r}: corrupt ({steps[bad[0]]} steps, "
                                 f"column {self.length!r} says {lengths[bad[0]]})")
        buckets = batch.column(self.bucket).to_numpy(zero_copy_only=False)
        if not len(buckets) or (buckets != buckets[0]).any() or not 0 <= buckets[0] < len(self.pad_to):
            raise InputError(f"{where()}, column {self.bucket!r}: corrupt (not one bucket of the "
                             f"{len(self.pad_to)} the manifest records)")
        longest = int(lengths.max(initial=0))
        fixed = self.pad_to[int(buckets[0])]
        width = longest if fixed is None else fixed
        rows = batch.num_rows
        if width < longest or rows * width > MAX_PADDED_STEPS:
            raise InputError(f"{where()}, column {self.length!r}: corrupt (a row of {longest} steps in a batch of "
                             f"{rows} rows padded to {width})")
        pad_steps = rows * width - int(lengths.sum())
        columns = {name: _padded_bytes(batch.column(name), rows * width, pad_steps, self.pad_values[name])
                   for name in sequences}
        total = sum(columns.values()) + (rows * width if self.mask is not None else 0)  # (the mask: a byte a step)
        if total > MAX_PADDED_BYTES:
            name = max(columns, key=columns.__getitem__, default=self.mask)  # (the mask alone was asked for)
            value = _bytes(self.pad_values.get(name))
            pad = f" with a pad value of {len(value):,} bytes" if value is not None else ""
            raise InputError(f"{where()}, column {name!r}: padding {rows} rows to {width:,} steps{pad} would take "
                             f"{total / 2**20:,.0f} MiB, more than a batch padded on load may "
                             f"({MAX_PADDED_BYTES >> 20:,} MiB); the manifest's output.padding is damaged")
        return lengths, width, total


def _padded_bytes(column: pa.Array, steps: int, pad_steps: int, pad_value: Any) -> int:
    """Bytes a list column takes padded to `steps` steps in all, `pad_steps` of them padding: each step's fixed
    width; for strings and binaries (variable width), each step's offset, the real steps' bytes as stored and the
    pad value's for every pad step (a long pad value is what could make a batch huge)."""
    step = column.type.value_type
    width = 1
    while pa.types.is_fixed_size_list(step):
        width *= step.list_size
        step = step.value_type
    try:
        return steps * width * max(step.bit_width, 8) // 8
    except ValueError:  # no fixed width: strings, binaries
        value = _bytes(pad_value)
        if value is None:
            return steps * width * 8
        return steps * width * 8 + column.values.nbytes + pad_steps * width * len(value)


def _bytes(pad_value: Any) -> bytes | None:
    """A string or binary pad value's bytes; None for a number."""
    return pad_value.encode() if isinstance(pad_value, str) else pad_value if isinstance(pad_value, bytes) else None
