"""segment's per-chunk work before lane planning: the output schema and pad values from the input's types, and
each chunk's checks (keys, lengths) and segment counts, pure functions that run on the engine's workers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import fs, rng
from batchtool.io.dataset import Chunk
from batchtool.core.errors import InputError, OptionInputError
from batchtool.ops import names as own
from batchtool.ops.base import ColumnError
from batchtool.ops.regroup import DistinctKeys
from batchtool.ops.segment.options import METADATA, STEPS, SegmentOptions
from batchtool.io.padding import default_pad, parse_pad_values, sequence_lengths
from batchtool.io.stats import is_sequence_type
from batchtool.io.workspace import Workspace

"""Per-row metadata, with NextQueuedSequenceBatch's names and types, plus the lane and the batch index."""
_POLY = np.uint64(0x100000001B3)


@dataclass(frozen=True)
class SegmentPlan:
    """What every batch-building call needs: the options, each sequence column's pad value, the output schema."""

    options: SegmentOptions
    pad_values: Mapping[str, Any]
    schema: pa.Schema
    memory: int
    """--memory, which bounds one step of padded batches (one per rank) and the lanes' planning."""


def make_plan(schema: pa.Schema, options: SegmentOptions, memory: int) -> SegmentPlan:
    """Check the input columns' types and fix the output schema (`options` with their context resolved)."""
    key_type = schema.field(options.key).type
    if not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)
            or pa.types.is_binary(key_type) or pa.types.is_large_binary(key_type)):
        raise ColumnError("key", f"{{key}} {options.key!r} is {key_type}: expected a string column")
    for name in options.sequence:
        if not is_sequence_type(schema.field(name).type):
            raise ColumnError("sequence", f"{{sequence}} {name!r} is {schema.field(name).type}: expected a list column")
    if options.input_length and not pa.types.is_integer(schema.field(options.input_length).type):
        raise ColumnError("input_length", f"{{input_length}} {options.input_length!r} is "
                          f"{schema.field(options.input_length).type}: expected an integer column")
    pad_values = parse_pad_values(options.pad_value, schema)
    pads = {name: pad_values.get(name, default_pad(schema.field(name).type)) for name in options.sequence}
    assert options.context is not None, "make_plan takes options with their context resolved"
    names = options.names
    fields = [pa.field(names[name], pa.type_for_alias(t)) for name, t in METADATA]
    fields += [schema.field(name) for name in options.context]
    fields += [pa.field(name, pa.list_(schema.field(name).type.value_field), metadata=schema.field(name).metadata)
               for name in options.sequence]
    fields += [schema.field(column).with_name(name) for name, column in options.states.items()]
    return SegmentPlan(options, pads, pa.schema(fields, metadata=schema.metadata), memory)


@dataclass(frozen=True)
class Examples:
    """One input chunk, checked, with what lane planning needs per example. Its rows stay in the workspace
    (`stored`), where the task that builds a batch reads them: the planner and the work items it sends carry only
    the numbers."""

    data: pa.RecordBatch | None
    """The rows (None while they are `stored`)."""
    ids: np.ndarray
    keys: pa.Array | None
    """The key column as UTF-8 strings (None while `stored`)."""
    value_length: np.ndarray
    """Steps in the sequence columns."""
    total_length: np.ndarray
    """Real steps: --input-length, else the value length."""
    count: np.ndarray
    """Segments (`NextQueuedSequenceBatch.sequence_count`)."""
    key_hash: np.ndarray | None
    """Each key's 64-bit hash (key_hashes); None once written where the check reads it (prepare_shared)."""
    ordinals: np.ndarray | None = None
    """Each row's position in the input; set by the planner, which sees chunks in order."""
    stored: str | None = None
    """An Arrow IPC file holding `data` with `keys` as its last column (prepare_shared)."""
    stored_rows: np.ndarray | None = None
    """The row of each example in `stored` (None: the same rows, in order)."""

    @property
    def num_rows(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray) -> Examples:
        """Only these rows: what a work item bound for another process carries of a chunk (the examples it
        plays, not the whole chunk; of a stored chunk, their numbers and where they are)."""
        def some(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[rows]

        index = pa.array(rows)
        return Examples(None if self.data is None else self.data.take(index), self.ids[rows],
                        None if self.keys is None else self.keys.take(index), self.value_length[rows],
                        self.total_length[rows], self.count[rows], some(self.key_hash), some(self.ordinals),
                        self.stored, rows if self.stored is not None and self.stored_rows is None
                        else some(self.stored_rows))

    def kept_at(self, path: str) -> Examples:
        """These examples with their rows left in `path` (written by `with_keys`) instead of carried."""
        return replace(self, data=None, keys=None, stored=path, stored_rows=None)

    def with_keys(self) -> pa.RecordBatch:
        """The rows and their keys as one batch, the keys last, as `stored` holds them."""
        assert self.data is not None and self.keys is not None
        return self.data.append_column(KEYS_COLUMN, self.keys)

    def loaded(self) -> Examples:
        """These examples with their rows, read (memory-mapped) from `stored` where the task runs."""
        if self.stored is None:
            return self
        with pa.memory_map(self.stored) as source:
            table = pa.ipc.open_file(source).get_batch(0)
        if self.stored_rows is not None:
            table = table.take(pa.array(self.stored_rows))
        last = table.num_columns - 1  # by position: a user column may share its name
        return replace(self, data=table.remove_column(last), keys=table.column(last), stored=None, stored_rows=None)


KEYS_COLUMN = "__batchtool_key__"
"""The keys' column in a stored chunk (read back by position)."""


def prepare_chunk(plan: SegmentPlan, locate: Callable[[int], str], chunk: Chunk) -> Examples:
    """Check one chunk's keys and lengths and count its segments; errors name the row."""
    o = plan.options
    data = chunk.data

    def row(i: int) -> str:
        return locate(int(chunk.ids[i]))

    keys = data.column(o.key)
    if keys.null_count:
        i = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{row(i)}: column {o.key!r} is null; every example needs a unique key")
    if pa.types.is_large_string(keys.type):  # (pandas' strings): keys are string wherever batches meet
        keys = keys.cast(pa.string())
    elif not pa.types.is_string(keys.type):
        try:
            keys = keys.cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise InputError(f"{row(0)}..{row(len(keys) - 1)}: column {o.key!r} holds a key that is not UTF-8 "
                             f"text ({exc})") from exc
    colon = pc.match_substring(keys, ":").to_numpy(zero_copy_only=False)
    if colon.any():
        i = int(np.flatnonzero(colon)[0])
        raise InputError(f"{row(i)}: key {keys[i].as_py()!r} contains ':', which segment keys use as their "
                         "separator (as in batch_sequences_with_states)")
    value = sequence_lengths(data, o.sequence, row)
    for role, column in o.adopted:
        own.check_adopted(chunk, column, value, locate, "segment", role, "the sequence has {} steps", steps=STEPS)
    if o.adopted:
        data = data.drop_columns([column for _, column in o.adopted])
    U = o.num_unroll
    if not o.pad:
        bad = np.flatnonzero((value % U != 0) | (value == 0))
        if len(bad):
            i = int(bad[0])
            raise OptionInputError("num_unroll", f"column {o.sequence[0]!r} has {value[i]} steps, not a positive "
                                   f"multiple of {{num_unroll}} {U} ({{no_pad}} requires it; the default {{pad}} pads)",
                                   mentions=("no_pad", "pad"), where=f"{row(i)}: ")
    total = value
    if o.input_length:
        given = data.column(o.input_length)
        if given.null_count:
            i = int(np.flatnonzero(given.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{row(i)}: column {o.input_length!r} is null")
        total = given.to_numpy(zero_copy_only=False).astype(np.int64)
        bad = np.flatnonzero((total < 0) | (total > value))
        if len(bad):
            i = int(bad[0])
            raise InputError(f"{row(i)}: column {o.input_length!r} is {total[i]}, but the sequence has {value[i]} "
                             "steps (the input length must be between 0 and the sequence length)")
    count = np.maximum(1, -(-value // U)) if o.pad else value // U
    return Examples(data, chunk.ids, keys, value, total, count, key_hashes(keys))


def key_hashes(keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of each key's bytes (a polynomial over the bytes, then mixed); vectorised, deterministic.

    Equal hashes are only candidates: the duplicate-key check confirms them with the real keys.
    """
    keys = keys.cast(pa.large_binary())
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[keys.offset: keys.offset + len(keys) + 1]
    data = np.frombuffer(data_buf, np.uint8)[offsets[0]: offsets[-1]] if data_buf is not None \
        else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    position = ranges(np.zeros(len(lengths), np.int64), lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=0)) + 1, _POLY, dtype=np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        weighted = (data.astype(np.uint64) + np.uint64(1)) * powers[position]
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(weighted, dtype=np.uint64)])
        rel = offsets - offsets[0]
        poly = sums[rel[1:]] - sums[rel[:-1]] + lengths.astype(np.uint64)
    return rng.keyed_hash(0, "segment/key", poly)


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ranges [start, start + count) as one index array."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    ends = np.cumsum(counts)
    return np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts) + np.repeat(starts, counts)


def prepare_shared(plan: SegmentPlan, locate: Callable[[int], str], space: Workspace | None, keys: DistinctKeys,
                   index: int, chunk: Chunk) -> Examples:
    """prepare_chunk for chunk number `index`, its key hashes written for the key check (`keys`). Where the tasks that
    build batches run elsewhere, its rows go to the workspace (`space`), where they read them, and the examples come
    back with their numbers only; where they are the driver's threads (`space` None) the rows stay in memory, since a
    round trip through a file would cost a write, a memory map and a copy of every row."""
    examples = prepare_chunk(plan, locate, chunk)
    assert examples.key_hash is not None
    keys.write(index, examples.key_hash, examples.ids)
    kept = examples if space is None else examples.kept_at(write_rows(space, index, examples.with_keys()))
    return replace(kept, key_hash=None)


def write_rows(space: Workspace, index: int, rows: pa.RecordBatch) -> str:
    """Chunk number `index`'s rows as an Arrow IPC file of the workspace, published once complete (replacing what
    a failed earlier attempt of the task wrote); returns its path."""
    fs.check_shared(space.directory, space.name)
    writing = os.path.join(space.directory, f".c{index:09d}-{uuid.uuid4().hex}")
    own = os.path.join(space.directory, f"c{index:09d}.arrow")
    with space.errors():
        with pa.OSFile(writing, "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
            writer.write_batch(rows)
        os.replace(writing, own)
    return own


__all__ = ["METADATA", "Examples", "SegmentPlan", "key_hashes", "make_plan", "prepare_chunk", "ranges"]
