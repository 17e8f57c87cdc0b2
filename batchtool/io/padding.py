"""Padding sequence (list) columns to a common length: shared by bucket, segment, mix and balanced batches."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core.errors import OptionError, SchemaError
from batchtool.io.stats import is_sequence_type

MAX_PADDED_STEPS = (1 << 31) - 1
"""Steps of one padded column of a batch (rows x padded length) at most: what a list<...> column's int32 offsets
hold."""


def parse_pad_values(specs: Sequence[str], schema: pa.Schema) -> dict[str, Any]:
    """'tokens=0', 'frames=-1.5', 'words=<pad>' -> {column: value of the column's element type}."""
    values: dict[str, Any] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep:
            raise OptionError("pad_value", "expected COLUMN=VALUE", value=repr(spec))
        if name not in schema.names:
            raise OptionError("pad_value", f"no column {name!r} (available: {', '.join(schema.names)})",
                              value=repr(spec))
        element = element_type(schema.field(name).type)
        try:
            if pa.types.is_integer(element):
                values[name] = int(text)
            elif pa.types.is_floating(element):
                values[name] = float(text)
            elif pa.types.is_boolean(element):
                values[name] = text.lower() in ("1", "true", "yes")
            elif pa.types.is_fixed_size_binary(element):
                values[name] = text.encode()
                if len(values[name]) != element.byte_width:
                    raise ValueError
            elif pa.types.is_binary(element) or pa.types.is_large_binary(element):
                values[name] = text.encode()
            else:
                values[name] = text
        except ValueError:
            raise OptionError("pad_value", f"{text!r} is not a {element} value", value=repr(spec)) from None
        if pa.types.is_integer(element):
            try:
                pa.scalar(values[name], element)
            except (OverflowError, pa.ArrowInvalid):
                raise OptionError("pad_value", f"{text!r} is out of the range of {element}", value=repr(spec)) from None
    return values


def element_type(t: pa.DataType) -> pa.DataType:
    """The scalar type inside list / fixed_size_list nesting."""
    while is_sequence_type(t):
        t = t.value_type
    return t


def default_pad(t: pa.DataType) -> Any:
    """0 for numbers, False for booleans, the empty string for strings (TensorFlow's PaddingFIFOQueue), zero
    bytes for fixed-size binary (a uuid's storage)."""
    e = element_type(t)
    if pa.types.is_string(e) or pa.types.is_large_string(e):
        return ""
    if pa.types.is_fixed_size_binary(e):
        return bytes(e.byte_width)
    if pa.types.is_binary(e) or pa.types.is_large_binary(e):
        return b""
    if pa.types.is_boolean(e):
        return False
    return 0


def row_lengths(arr: pa.Array) -> np.ndarray:
    """Steps per row of a list column (a null row has 0 steps)."""
    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def sequence_lengths(batch: pa.RecordBatch, columns: Sequence[str], locate: Callable[[int], str]) -> np.ndarray:
    """The shared time length of several sequence columns; an error names the first row where they disagree."""
    lengths = None
    for name in columns:
        if not is_sequence_type(batch.schema.field(name).type):
            raise SchemaError(f"column {name!r} is {batch.schema.field(name).type}, not a sequence (list) column")
        these = row_lengths(batch.column(name))
        if lengths is None:
            lengths = these
            first = name
            continue
        bad = np.flatnonzero(these != lengths)
        if len(bad):
            i = int(bad[0])
            raise SchemaError(f"{locate(i)}: sequence columns disagree in length: {first!r} has {lengths[i]} "
                              f"steps, {name!r} has {these[i]}")
    return lengths if lengths is not None else np.zeros(batch.num_rows, dtype=np.int64)


def pad_list_column(arr: pa.Array, length: int, pad_value: Any) -> pa.Array:
    """Every row padded on the right to exactly `length` steps (rows must not be longer)."""
    values, offsets = list_values(arr)
    lens = np.diff(offsets) if not arr.null_count else row_lengths(arr)  # (a null row may span values)
    if len(arr) and lens.max(initial=0) > length:
        raise ValueError(f"a row has {lens.max()} steps, more than the padded length {length}")
    return padded_list([values], np.zeros(len(arr), dtype=np.int64), offsets[:-1], lens, length, pad_value,
                       arr.type.value_field)


def list_values(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A list column's values and its row offsets into them (starting at 0), honouring slicing.

    Unlike flatten(), values behind null rows stay, so the offsets stay valid.
    """
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        return arr.values.slice(arr.offset * size, len(arr) * size), np.arange(len(arr) + 1, dtype=np.int64) * size
    offsets = arr.offsets.to_numpy().astype(np.int64)
    return arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])), offsets - offsets[0]


PAD_SCRATCH_BYTES = 64 << 20
"""Per thread, the most kept for padding's working arrays between batches (the real-step mask, the gather index,
steps gathered from scattered rows). A batch needing more gets fresh arrays, freed after it: what a thread keeps
stays within this whatever a file holds."""
_scratch = threading.local()


def scratch(name: str, count: int, dtype: np.dtype | type) -> np.ndarray:
    """`count` elements of a working array reused by this thread from batch to batch (pages faulted in once, not
    once a batch), grown to the largest batch so far, up to PAD_SCRATCH_BYTES. Its contents are undefined, and the
    next call under `name` on this thread overwrites them: for arrays that never leave the caller (a pyarrow array
    of numbers made from it would be a view of it)."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    kept: dict[str, np.ndarray] = _scratch.__dict__
    held = kept.get(name)
    if held is None or len(held) < nbytes:
        if nbytes > PAD_SCRATCH_BYTES:
            return np.empty(count, dtype=dtype)
        grown = 0 if held is None else 2 * len(held)  # (doubling: a few growths, then none)
        held = kept[name] = np.empty(max(nbytes, 4096, grown if grown <= PAD_SCRATCH_BYTES else 0), dtype=np.uint8)
    return held[:nbytes].view(dtype)


def padded_list(sources: Sequence[pa.Array], source: np.ndarray, starts: np.ndarray, lens: np.ndarray, length: int,
                pad_value: Any, value_field: pa.Field) -> pa.ListArray:
    """list<value_field> of `length` steps a row: row i is sources[source[i]][starts[i]:][:lens[i]], then
    pad_value. Written straight into the padded buffer, never a copy of the sources (segment reads a few
    steps of each of many long examples); NumPy and Arrow kernels do the copying, a constant number of calls a
    batch (a few a source), so other threads keep the GIL."""
    n = len(lens)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * length)
    leaves, width, leaf_type = _numeric_leaves(sources)
    if leaves is not None:
        values = _copy_rows(leaves, width, leaf_type, sources[0].type, np.asarray(source, dtype=np.int64),
                            np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64), length, pad_value)
    else:
        values = _take_rows(sources, source, starts, lens, length, pad_value)
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(value_field))


def _copy_rows(leaves: list[np.ndarray], width: int, leaf_type: pa.DataType, t: pa.DataType, source: np.ndarray,
               starts: np.ndarray, lens: np.ndarray, length: int, pad_value: Any) -> pa.Array:
    """Numbers (in fixed-size vectors) without nulls, written into the output buffer: the pad value everywhere,
    then every real step at once through a mask of the real steps (a step: one element of `width` numbers).
    The output buffer leaves with the batch (to the writer, or to the user from a loader), so it is never reused
    here: it comes from Arrow's memory pool, which hands freed batches' memory to the next (a fresh NumPy array
    of a batch's size would be new pages from the OS each time). The working arrays stay here and are reused
    (scratch)."""
    n = len(lens)
    dtype = np.dtype(leaf_type.to_pandas_dtype())
    step = np.dtype((np.void, width * dtype.itemsize))
    buffer = pa.allocate_buffer(n * length * width * dtype.itemsize)
    out = np.frombuffer(buffer, dtype=dtype)
    out.fill(pad_value)
    real = scratch("real", n * length, np.bool_)
    np.less(np.arange(length, dtype=np.int64), lens[:, None], out=real.reshape(n, length))
    steps = [np.ascontiguousarray(leaf).view(step) for leaf in leaves]
    out.view(step)[real] = _real_steps(steps, step, source, starts, lens)
    array = pa.Array.from_buffers(leaf_type, n * length * width, [None, buffer])
    nesting = []
    while pa.types.is_fixed_size_list(t):
        nesting.append(t)
        t = t.value_type
    for fixed in reversed(nesting):
        array = pa.FixedSizeListArray.from_arrays(array, type=fixed)
    return array


def _real_steps(steps: list[np.ndarray], step: np.dtype, source: np.ndarray, starts: np.ndarray,
                lens: np.ndarray) -> np.ndarray:
    """Every row's real steps, one row after another: a view of the source where the rows lie one after another
    in one source (bucket, pack), else gathered into a reused array (segment's windows of several examples)."""
    used = lens > 0
    source, starts, lens = source[used], starts[used], lens[used]
    total = int(lens.sum())
    if not total:
        return np.empty(0, dtype=step)
    if (source == source[0]).all() and (starts[1:] == starts[:-1] + lens[:-1]).all():
        return steps[int(source[0])][starts[0]:starts[0] + total]
    index = scratch("index", total, np.int64)  # each real step's place in its source: +1 a step, a jump a row
    index.fill(1)
    index[(np.cumsum(lens) - lens)[1:]] = starts[1:] - (starts[:-1] + lens[:-1] - 1)
    index[0] = starts[0]
    np.cumsum(index, out=index)
    gathered = scratch("gathered", total, step)
    if len(steps) == 1:
        return np.take(steps[0], index, out=gathered)
    of = np.repeat(source, lens)
    for s, values in enumerate(steps):
        take = of == s
        gathered[take] = values[index[take]]
    return gathered


def _take_rows(sources: Sequence[pa.Array], source: np.ndarray, starts: np.ndarray, lens: np.ndarray, length: int,
               pad_value: Any) -> pa.Array:
    """With nulls, or not numbers: Arrow's take of every step, then the pad where a row has ended."""
    t = sources[0].type
    steps = np.arange(length, dtype=np.int64)
    real = (steps < np.asarray(lens, dtype=np.int64)[:, None]).ravel()
    index = (np.asarray(starts, dtype=np.int64)[:, None] + steps).ravel()
    base = np.cumsum([0] + [len(s) for s in sources])
    flat = np.repeat(base[np.asarray(source, dtype=np.int64)], length) + index
    taken = pa.chunked_array(sources, type=t).take(pa.array(flat, mask=~real)).combine_chunks()
    if real.all():
        return taken
    return pc.if_else(pa.array(real), taken, pa.scalar(_pad_step(t, pad_value), type=t))  # a null stays null


def _pad_step(t: pa.DataType, pad_value: Any) -> Any:
    """One step of padding: pad_value, a vector of them for a step that is a fixed-size vector, and no values at
    all for a step that is itself a variable-length list (a padding step holds nothing; `length` and the mask say
    where the real steps end)."""
    if pa.types.is_fixed_size_list(t):
        return [_pad_step(t.value_type, pad_value)] * t.list_size
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return []
    return pad_value


def _numeric_leaves(sources: Sequence[pa.Array]) -> tuple[list[np.ndarray] | None, int, pa.DataType]:
    """Each source's values as one flat NumPy view, the values per step and their type, when every level is
    numbers (inside fixed-size lists) without nulls; (None, 0, type) otherwise."""
    t, width = sources[0].type, 1
    arrays = list(sources)
    while pa.types.is_fixed_size_list(t):
        if any(a.null_count for a in arrays):
            return None, 0, t
        arrays = [a.values.slice(a.offset * t.list_size, len(a) * t.list_size) for a in arrays]
        width *= t.list_size
        t = t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or any(a.null_count for a in arrays):
        return None, 0, t
    return [a.to_numpy(zero_copy_only=False) for a in arrays], width, t


def pad_batch(batch: pa.RecordBatch, columns: Sequence[str], length: int | None,
              pad_values: Mapping[str, Any]) -> pa.RecordBatch:
    """The batch with the given sequence columns as list<...> padded to `length` steps (None: left at their real
    lengths, what `bucket --padding on-load` stores); other columns unchanged."""
    def listed(f: pa.Field) -> pa.Array:
        arr = batch.column(f.name)
        if length is None:
            return arr.cast(pa.list_(f.type.value_field))
        return pad_list_column(arr, length, pad_values.get(f.name, default_pad(f.type)))

    arrays = [listed(f) if f.name in columns else batch.column(f.name) for f in batch.schema]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(
        [pa.field(f.name, pa.list_(f.type.value_field), metadata=f.metadata) if f.name in columns else f
         for f in batch.schema]))


def padded_batch(data: pa.RecordBatch, sequences: Sequence[str], pad_length: int | None, pad_values: Mapping[str, Any],
                 own: Sequence[tuple[str, pa.Array]], lengths: tuple[str, pa.Array], mask: str | None) -> pa.RecordBatch:
    """One padded output batch, as bucket and mix write them: `data`'s columns with the sequence columns padded to
    `pad_length` (None: at their real lengths, for load to pad), then the op's `own` columns, the column of each
    row's real steps (`lengths`: its name and values; replacing a column of that name in `data`) and, beside padded
    columns, the `mask` column (None: none)."""
    padded = pad_batch(data, sequences, pad_length, pad_values)
    names = [name for name in padded.schema.names if name != lengths[0]]
    arrays = [padded.column(name) for name in names]
    for name, array in (*own, lengths):
        names.append(name)
        arrays.append(array)
    if mask is not None and pad_length is not None:
        arrays.append(mask_column(lengths[1].to_numpy(), pad_length))
        names.append(mask)
    kept = {f.name: f.metadata for f in padded.schema}  # the metadata that marks an extension type's storage
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([pa.field(n, a.type, metadata=kept.get(n))
                                                                for n, a in zip(names, arrays)]))


@dataclass(frozen=True)
class BatchPadding:
    """Batches padded to their longest row (`mix --pad`): the sequence columns, which agree in length row by row,
    their pad values, and the names of the length and mask (None: none) columns it adds."""

    sequences: tuple[str, ...]
    pad_values: Mapping[str, Any]
    length: str
    mask: str | None

    def check(self, batch: pa.RecordBatch, locate: Callable[[int], str]) -> None:
        """A SchemaError naming the first row (locate(i) of row i) whose sequence columns disagree in length."""
        sequence_lengths(batch, self.sequences, locate)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch padded to its longest row, with the length (and mask) column."""
        lengths = row_lengths(batch.column(self.sequences[0])) if self.sequences else np.zeros(batch.num_rows,
                                                                                                np.int64)
        return padded_batch(batch, self.sequences, int(lengths.max(initial=0)), self.pad_values, (),
                            (self.length, pa.array(lengths.astype(np.int32))), self.mask)


def mask_column(lengths: np.ndarray, length: int) -> pa.Array:
    """list<bool> of `length` steps per row, True on real steps: what a trainer multiplies its loss by."""
    lengths = np.asarray(lengths)
    mask = scratch("mask", len(lengths) * length, np.bool_)  # (pa.array packs it into bits: a copy)
    np.less(np.arange(length), lengths[:, None], out=mask.reshape(len(lengths), length))
    offsets = pa.array((np.arange(len(lengths) + 1) * length).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(mask))
