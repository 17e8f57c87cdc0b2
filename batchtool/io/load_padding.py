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


def spec(sequences: Sequence[str], pad_values: Sequence[str], pad_to: Sequence[Any], length: str,
         bucket: str, mask: str | None, lengths: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest's output.padding: the sequence columns, their --pad-value specs, each bucket's padded length
    (None: the batch's longest row), the columns holding each row's length and the batch's bucket, and the mask
    column to add (None: none). With `lengths` (two --length: each sequence's length column), each bucket's
    padded lengths are a list, one per sequence, and each sequence is padded to its own."""
    recorded = {"sequences": list(sequences), "pad_values": list(pad_values),
                "pad_to": [list(p) if lengths is not None else p for p in pad_to],
                "length": length, "bucket": bucket, "mask": mask}
    if lengths is not None:
        recorded["lengths"] = list(lengths)
    return recorded


@dataclass(frozen=True)
class LoadPadding:
    """How a loader pads the stored batches of one output (from its manifest, checked against its schema)."""

    sequences: tuple[str, ...]
    pad_values: dict[str, Any]
    pad_to: tuple[tuple[int | None, ...], ...]
    """Per bucket, the padded length of each sequence, then of the mask if any (None: the batch's longest row)."""
    lengths: tuple[str, ...]
    """The length column of each sequence, then of the mask if any: what it is padded by."""
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
        lengths = recorded.get("lengths")
        if lengths is not None and not (isinstance(lengths, list) and len(lengths) == len(sequences) and all(
                isinstance(n, str) and n in names and pa.types.is_integer(stored.field(n).type) for n in lengths)):
            raise refuse("lengths", lengths, "a list of integer columns of the output, one per sequence")
        if lengths is not None and mask is not None:
            raise refuse("mask", mask, "null with per-sequence lengths")
        width = None if lengths is None else len(sequences)
        pad_to = recorded.get("pad_to")
        if not (isinstance(pad_to, list) and pad_to and all(_targets(p, width) for p in pad_to)):
            raise refuse("pad_to", pad_to, "a list of padded lengths (integers or null), one per bucket"
                         + ("" if width is None else f", each a list of {width}, one per sequence"))
        specs = recorded.get("pad_values")
        if not (isinstance(specs, list) and all(isinstance(s, str) for s in specs)):
            raise refuse("pad_values", specs, "a list of COLUMN=VALUE strings")
        try:
            values = parse_pad_values(specs, stored)
        except BatchtoolError as exc:
            raise InputError(f"{path}: output.padding.pad_values: {exc}") from exc
        values = {name: values.get(name, default_pad(stored.field(name).type)) for name in sequences}
        padded = len(sequences) + (mask is not None)
        if lengths is None:  # one length: every sequence (and the mask) padded to the bucket's one target
            lengths, pad_to = [recorded["length"]] * padded, [[p] * padded for p in pad_to]
        return LoadPadding(tuple(sequences), values, tuple(tuple(p) for p in pad_to), tuple(lengths),
                           recorded["length"], recorded["bucket"], mask)

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
        padding needs, the length columns and the bucket."""
        if columns is None:
            return None
        stored = [c for c in columns if c != self.mask]
        return stored + [c for c in dict.fromkeys((*self.lengths, self.length, self.bucket)) if c not in stored]

    def padded_bytes(self, batch: pa.RecordBatch, where: Callable[[], str]) -> int:
        """Bytes `batch` (read as stored_columns) takes padded, its padded sequence columns: checked as `pad`
        checks it, so nothing need be allocated to learn it."""
        return self._measure(batch, where)[1]

    def pad(self, batch: pa.RecordBatch, columns: Sequence[str] | None, where: Callable[[], str]) -> pa.RecordBatch:
        """The stored `batch` (read as stored_columns(columns)) padded as bucket would have written it, with the
        mask, in the order of `columns` (None: every column). An InputError starting with `where()` if a row's
        steps disagree with its length column, the batch's bucket is not the output's, or padded it would take more
        than MAX_PADDED_BYTES (naming the column that takes most)."""
        widths, _ = self._measure(batch, where)
        padded = batch
        for name in self.sequences:
            if name in batch.schema.names:
                padded = pad_batch(padded, [name], widths[name][1], self.pad_values)
        if self.mask is not None:
            lengths, width = widths[self.mask]
            padded = padded.append_column(pa.field(self.mask, pa.list_(pa.bool_())), mask_column(lengths, width))
        return padded.select(columns if columns is not None else padded.schema.names)

    def _measure(self, batch: pa.RecordBatch, where: Callable[[], str]) -> tuple[dict[str, tuple[np.ndarray, int]],
                                                                                  int]:
        """Per sequence read (and the mask) its rows' lengths and padded length, and the padded bytes of a stored
        batch, checked."""
        buckets = batch.column(self.bucket).to_numpy(zero_copy_only=False)
        if not len(buckets) or (buckets != buckets[0]).any() or not 0 <= buckets[0] < len(self.pad_to):
            raise InputError(f"{where()}, column {self.bucket!r}: corrupt (not one bucket of the "
                             f"{len(self.pad_to)} the manifest records)")
        names = self.sequences + ((self.mask,) if self.mask is not None else ())
        rows = batch.num_rows
        widths: dict[str, tuple[np.ndarray, int]] = {}
        for name, length, fixed in zip(names, self.lengths, self.pad_to[int(buckets[0])]):
            if name != self.mask and name not in batch.schema.names:
                continue
            lengths = batch.column(length).to_numpy(zero_copy_only=False).astype(np.int64)
            if name != self.mask:
                steps = row_lengths(batch.column(name))
                bad = np.flatnonzero(steps != lengths)
                if len(bad):
                    raise InputError(f"{where()}, row {int(bad[0])}, column {name!r}: corrupt ({steps[bad[0]]} "
                                     f"steps, column {length!r} says {lengths[bad[0]]})")
            longest = int(lengths.max(initial=0))
            width = longest if fixed is None else fixed
            if width < longest or rows * width > MAX_PADDED_STEPS:
                raise InputError(f"{where()}, column {length!r}: corrupt (a row of {longest} steps in a batch of "
                                 f"{rows} rows padded to {width})")
            widths[name] = lengths, width
        columns = {name: _padded_bytes(batch.column(name), rows * width, rows * width - int(lengths.sum()),
                                       self.pad_values[name])
                   for name, (lengths, width) in widths.items() if name != self.mask}
        mask = rows * widths[self.mask][1] if self.mask is not None else 0  # (the mask: a byte a step)
        total = sum(columns.values()) + mask
        if total > MAX_PADDED_BYTES:
            name = max(columns, key=columns.__getitem__, default=self.mask)  # (the mask alone was asked for)
            value = _bytes(self.pad_values.get(name))
            pad = f" with a pad value of {len(value):,} bytes" if value is not None else ""
            raise InputError(f"{where()}, column {name!r}: padding {rows} rows to {widths[name][1]:,} steps{pad} "
                             f"would take {total / 2**20:,.0f} MiB, more than a batch padded on load may "
                             f"({MAX_PADDED_BYTES >> 20:,} MiB); the manifest's output.padding is damaged")
        return widths, total


def _targets(pad_to: Any, width: int | None) -> bool:
    """Is `pad_to` one bucket's padded length (width None) or a list of `width` of them, each an integer in
    [0, MAX_PADDED_STEPS] or null?"""
    if width is not None:
        return isinstance(pad_to, list) and len(pad_to) == width and all(_targets(p, None) for p in pad_to)
    return pad_to is None or (isinstance(pad_to, int) and not isinstance(pad_to, bool)
                              and 0 <= pad_to <= MAX_PADDED_STEPS)


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
