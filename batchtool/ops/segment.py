"""`segment`: split sequences into `num_unroll`-step segments, batched lane by lane for truncated BPTT.

Each of the B rows of a batch is a lane that plays one example's segments in order in
consecutive batches, then the next example's, so a trainer keeps its recurrent state as a
`[B, ...]` array and resets lane b where `sequence[b] == 0`. Lane planning is sequential
and cheap (it only looks at segment counts); cutting, padding and encoding the batches
are pure functions of a work item, run on worker threads.
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool import budget, fs, rng
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.engines import with_engine
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.output import OutputOptions
from batchtool.padding import default_pad, list_values, padded_list, parse_pad_values, sequence_lengths
from batchtool.runner import ordered_map
from batchtool.spill import make_temporary_dir, temporary_write_errors
from batchtool.stats import is_sequence_type

METADATA: tuple[tuple[str, pa.DataType], ...] = (
    ("key", pa.string()), ("next_key", pa.string()), ("sequence", pa.int32()), ("sequence_count", pa.int32()),
    ("length", pa.int32()), ("total_length", pa.int32()), ("insertion_index", pa.int64()), ("lane", pa.int32()),
    ("batch", pa.int64()))
"""Per-row metadata, with NextQueuedSequenceBatch's names and types, plus the lane and the batch index."""

FIRST_INSERTION_INDEX = -(1 << 63)
"""TensorFlow's insertion_index of the first example; each later example (in input order) gets the next value."""
EMPTY_INSERTION_INDEX = (1 << 63) - 1
"""insertion_index of an empty padding row: never a real example's."""
LANE_WINDOW = 4
"""Examples taken per lane each time a lane runs dry (a fixed window of 4 * B examples)."""
ITEM_SEGMENTS = 2048
"""Segments per work item handed to a worker thread (rounded to whole batches)..."""
ITEM_BYTES = 16 << 20
"""...and at most this many bytes of padded segments per item (but at least one batch), so a long
--num-unroll does not multiply what a worker holds."""
LANE_BYTES = 1 << 10
"""Planner bookkeeping per lane (its queue, load and heap entry)."""
METADATA_BYTES = 64
"""Metadata per output row (keys, counters), beyond the example's own columns."""
DEFAULT_MEMORY = 1 << 30
KEY_PARTITION_BITS = 6
KEY_PARTITIONS = 1 << KEY_PARTITION_BITS
_KEY_ENTRY = np.dtype([("hash", "<u8"), ("id", "<u8")])
_POLY = np.uint64(0x100000001B3)


@dataclass(frozen=True)
class SegmentOptions:
    """What to segment and how to batch it; the CLI flags of `batchtool segment`."""

    key: str
    sequences: tuple[str, ...]
    num_unroll: int
    batch_size: int
    context: tuple[str, ...] | None = None
    """Per-example columns copied to every segment; None: every input column the other options do not use."""
    input_length: str | None = None
    pad: bool = True
    pad_values: tuple[str, ...] = ()
    """'COLUMN=VALUE' specs for sequence columns (default: 0, False or the empty string)."""
    initial_states: tuple[str, ...] = ()
    """'NAME=COLUMN' specs: COLUMN's value is written as NAME on the first segment of each example."""
    allow_small_batch: bool = False
    world_size: int = 1
    """Lane streams written, one per training rank: batch t of rank r is output batch t * world_size + r."""

    def __post_init__(self) -> None:
        if self.num_unroll < 1:
            raise UsageError(f"--num-unroll {self.num_unroll}: must be at least 1")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size}: must be at least 1")
        if self.world_size < 1:
            raise UsageError(f"--world-size {self.world_size}: must be at least 1")
        if not self.sequences:
            raise UsageError("--sequence: give at least one sequence (list) column")
        states = self.states
        for flag, names in (("--sequence", self.sequences), ("--context", self.context or ()),
                            ("--initial-state", tuple(states))):
            for name in names:
                if ":" in name:
                    raise UsageError(f"{flag} {name!r}: names may not contain ':' (as in batch_sequences_with_states)")
        reserved = [name for name, _ in METADATA]
        seen: dict[str, str] = {}
        for flag, names in (("--sequence", self.sequences), ("--context", self.context or ()),
                            ("--initial-state", tuple(states))):
            for name in names:
                if name in reserved:
                    raise UsageError(f"{flag} {name!r}: clashes with the metadata column {name!r} "
                                     f"(reserved: {', '.join(reserved)})")
                if name in seen:
                    raise UsageError(f"{flag} {name!r}: already given as {seen[name]} {name!r}; "
                                     "each output column must be named once")
                seen[name] = flag

    @property
    def states(self) -> dict[str, str]:
        """--initial-state specs as {output name: source column}."""
        out: dict[str, str] = {}
        for spec in self.initial_states:
            name, sep, column = spec.partition("=")
            if not sep or not name or not column:
                raise UsageError(f"--initial-state {spec!r}: expected NAME=COLUMN")
            if name in out:
                raise UsageError(f"--initial-state {spec!r}: state {name!r} is given twice")
            out[name] = column
        return out

    def with_context(self, schema: pa.Schema) -> SegmentOptions:
        """Without --context, every input column not used otherwise (key, sequences, --input-length,
        --initial-state sources) is context, so no column is dropped unasked; one that would clash
        with an output column is refused by name."""
        if self.context is not None:
            return self
        used = {self.key, *self.sequences, *self.states.values(), self.input_length}
        rest = tuple(name for name in schema.names if name not in used)
        taken = {name for name, _ in METADATA} | set(self.states)
        clashes = [name for name in rest if name in taken]
        if clashes:
            raise UsageError(f"input column(s) {', '.join(map(repr, clashes))} would be copied as context but "
                             "clash with segment's output columns; rename them, or name the columns to keep with "
                             f"--context (the others are then not written: {', '.join(rest)})")
        return replace(self, context=rest)

    @property
    def source_columns(self) -> list[str]:
        """The input columns to read, each once."""
        cols = [self.key, *self.context, *self.sequences, *self.states.values()]
        if self.input_length:
            cols.append(self.input_length)
        return list(dict.fromkeys(cols))

    def manifest_options(self) -> dict[str, Any]:
        return {"key": self.key, "sequences": list(self.sequences), "num_unroll": self.num_unroll,
                "batch_size": self.batch_size, "context": list(self.context), "input_length": self.input_length,
                "pad": self.pad, "pad_values": list(self.pad_values), "initial_states": self.states,
                "allow_small_batch": self.allow_small_batch, "world_size": self.world_size}


@dataclass(frozen=True)
class SegmentPlan:
    """What every batch-building call needs: the options, each sequence column's pad value, the output schema."""

    options: SegmentOptions
    pad_values: Mapping[str, Any]
    schema: pa.Schema


def make_plan(schema: pa.Schema, options: SegmentOptions) -> SegmentPlan:
    """Check the input columns' types and fix the output schema."""
    key_type = schema.field(options.key).type
    if not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)
            or pa.types.is_binary(key_type) or pa.types.is_large_binary(key_type)):
        raise SchemaError(f"--key {options.key!r} is {key_type}: expected a string column")
    for name in options.sequences:
        if not is_sequence_type(schema.field(name).type):
            raise SchemaError(f"--sequence {name!r} is {schema.field(name).type}: expected a list column")
    if options.input_length and not pa.types.is_integer(schema.field(options.input_length).type):
        raise SchemaError(f"--input-length {options.input_length!r} is {schema.field(options.input_length).type}: "
                          "expected an integer column")
    for spec in options.pad_values:
        name = spec.partition("=")[0]
        if name not in options.sequences:
            raise UsageError(f"--pad-value {spec!r}: {name!r} is not a --sequence column "
                             f"(sequences: {', '.join(options.sequences)})")
    pad_values = parse_pad_values(options.pad_values, schema)
    pads = {name: pad_values.get(name, default_pad(schema.field(name).type)) for name in options.sequences}
    fields = [pa.field(name, t) for name, t in METADATA]
    fields += [schema.field(name) for name in options.context]
    fields += [pa.field(name, pa.list_(schema.field(name).type.value_field)) for name in options.sequences]
    fields += [schema.field(column).with_name(name) for name, column in options.states.items()]
    return SegmentPlan(options, pads, pa.schema(fields))


# --- per chunk: checks and segment counts (pure, on reader worker threads) -----------------------

@dataclass(frozen=True)
class Examples:
    """One input chunk, checked, with what lane planning needs per example."""

    data: pa.RecordBatch
    ids: np.ndarray
    keys: pa.Array
    """The key column as UTF-8 strings."""
    value_length: np.ndarray
    """Steps in the sequence columns."""
    total_length: np.ndarray
    """Real steps: --input-length, else the value length."""
    count: np.ndarray
    """Segments (`NextQueuedSequenceBatch.sequence_count`)."""
    key_hash: np.ndarray
    first_ordinal: int = 0
    """Position of the first row in the input; set by the planner, which sees chunks in order."""

    @property
    def num_rows(self) -> int:
        return self.data.num_rows


def prepare_chunk(chunk: Chunk, plan: SegmentPlan, locate: Callable[[int], str]) -> Examples:
    """Check keys and lengths of one chunk and count its segments; errors name the row."""
    o = plan.options
    data = chunk.data

    def row(i: int) -> str:
        return locate(int(chunk.ids[i]))

    keys = data.column(o.key)
    if keys.null_count:
        i = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{row(i)}: column {o.key!r} is null; every example needs a unique key")
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
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
    value = sequence_lengths(data, o.sequences, row)
    U = o.num_unroll
    if not o.pad:
        bad = np.flatnonzero((value % U != 0) | (value == 0))
        if len(bad):
            i = int(bad[0])
            raise InputError(f"{row(i)}: column {o.sequences[0]!r} has {value[i]} steps, not a positive multiple "
                             f"of --num-unroll {U} (--no-pad requires it; the default --pad pads)")
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

    Equal hashes are only candidates: KeyIndex's caller confirms them with the real keys.
    """
    keys = keys.cast(pa.large_binary())
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[keys.offset: keys.offset + len(keys) + 1]
    data = np.frombuffer(data_buf, np.uint8)[offsets[0]: offsets[-1]] if data_buf is not None \
        else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    position = _ranges(np.zeros(len(lengths), np.int64), lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=0)) + 1, _POLY, dtype=np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        weighted = (data.astype(np.uint64) + np.uint64(1)) * powers[position]
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(weighted, dtype=np.uint64)])
        rel = offsets - offsets[0]
        poly = sums[rel[1:]] - sums[rel[:-1]] + lengths.astype(np.uint64)
    return rng.keyed_hash(0, "segment/key", poly)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ranges [start, start + count) as one index array."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    ends = np.cumsum(counts)
    return np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts) + np.repeat(starts, counts)


# --- duplicate keys, in bounded memory ------------------------------------------------------------

class KeyIndex:
    """Finds keys that occur twice, in bounded memory.

    Holds 16 bytes per example (64-bit key hash + example id) up to `budget` bytes, then
    spills them to KEY_PARTITIONS temporary files by the hash's top bits; `collisions()`
    sorts one partition at a time. Collisions come out in hash order, whatever the budget.
    """

    def __init__(self, budget: int, tmp_dir: str | None = None) -> None:
        self.budget = budget
        self.tmp_dir = tmp_dir
        self._parts: list[np.ndarray] = []
        self._held = 0
        self._dir: str | None = None

    def add(self, hashes: np.ndarray, ids: np.ndarray) -> None:
        entries = np.empty(len(hashes), _KEY_ENTRY)
        entries["hash"], entries["id"] = hashes, ids
        self._parts.append(entries)
        self._held += entries.nbytes
        if self._held > self.budget:
            self._spill()

    def _spill(self) -> None:
        if self._dir is None:
            self._dir = make_temporary_dir("batchtool-keys-", self.tmp_dir)
        entries = np.concatenate(self._parts) if self._parts else np.zeros(0, _KEY_ENTRY)
        self._parts, self._held = [], 0
        part = (entries["hash"] >> np.uint64(64 - KEY_PARTITION_BITS)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(KEY_PARTITIONS + 1))
        for p in range(KEY_PARTITIONS):
            if bounds[p + 1] > bounds[p]:
                path = os.path.join(self._dir, f"keys-{p:03d}.bin")
                with temporary_write_errors(self.tmp_dir), open(path, "ab") as f:
                    entries[order[bounds[p]: bounds[p + 1]]].tofile(f)

    def collisions(self) -> Iterator[tuple[int, int]]:
        """(id of a key's first occurrence, id of a later one with the same hash), in hash order."""
        if self._dir is None:
            yield from _collisions(np.concatenate(self._parts) if self._parts else np.zeros(0, _KEY_ENTRY))
            return
        self._spill()
        for p in range(KEY_PARTITIONS):
            path = os.path.join(self._dir, f"keys-{p:03d}.bin")
            if os.path.exists(path):
                yield from _collisions(np.fromfile(path, _KEY_ENTRY))

    def close(self) -> None:
        if self._dir is not None:
            fs.remove_tree(self._dir)
            self._dir = None
        self._parts = []


def _collisions(entries: np.ndarray) -> Iterator[tuple[int, int]]:
    order = np.lexsort((entries["id"], entries["hash"]))
    h, ids = entries["hash"][order], entries["id"][order]
    same = np.flatnonzero(h[1:] == h[:-1]) + 1
    if not len(same):
        return
    run_start = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    first = run_start[np.searchsorted(run_start, same, side="right") - 1]
    for a, b in zip(ids[first], ids[same]):
        yield int(a), int(b)


def check_unique_keys(index: KeyIndex, dataset: Dataset, key: str, threads: int) -> None:
    """Raise InputError naming the first duplicate key (in hash order) and both rows, after confirming it."""
    batch: list[tuple[int, int]] = []
    for pair in index.collisions():
        batch.append(pair)
        if len(batch) == 64:
            _confirm(batch, dataset, key, threads)
            batch = []
    if batch:
        _confirm(batch, dataset, key, threads)


def _confirm(pairs: list[tuple[int, int]], dataset: Dataset, key: str, threads: int) -> None:
    """Read the real keys of colliding rows (one more pass over the key column: only on a hash hit)."""
    wanted = np.array(sorted({i for pair in pairs for i in pair}), dtype=np.uint64)
    keys: dict[int, str] = {}
    for chunk in dataset.chunks([key], threads):
        hit = np.isin(chunk.ids, wanted)
        if hit.any():
            values = chunk.data.column(key).filter(pa.array(hit)).to_pylist()
            keys.update(zip(chunk.ids[hit].tolist(), values))
    for a, b in pairs:
        if keys[a] == keys[b]:
            raise InputError(f"duplicate key {keys[a]!r}: {dataset.locate(a)} and {dataset.locate(b)} "
                             "(segment keys must be unique)")


# --- lane planning (sequential) -------------------------------------------------------------------

@dataclass(frozen=True)
class SegmentItem:
    """A run of consecutive batches: slot [t, b] (batch first_batch + t, lane b) plays segment seg[t, b] of
    row row[t, b] of sources[src[t, b]]; src -1 is an empty slot."""

    first_batch: int
    sources: tuple[Examples, ...]
    src: np.ndarray
    row: np.ndarray
    seg: np.ndarray
    finished: int
    """Examples whose last segment is in this item (progress and rows_in)."""


@dataclass
class SegmentStats:
    """Counts kept by the planner for the manifest."""

    examples: int = 0
    segments: int = 0
    batches: int = 0
    empty_slots: int = 0
    real_steps: int = 0
    max_sequence_count: int = 0
    empty_batches: int = 0
    """Batches of a rank whose lanes all finished before the other ranks' (written as empty rows)."""

    def as_dict(self, plan: SegmentPlan) -> dict[str, Any]:
        B, U = plan.options.batch_size, plan.options.num_unroll
        slots = self.batches * B
        rows = self.segments + self.empty_batches * B if plan.options.allow_small_batch else slots
        return {"examples": self.examples, "segments": self.segments, "batches": self.batches,
                "lanes": B, "rows_written": rows, "empty_slots": self.empty_slots,
                "empty_slot_fraction": round(self.empty_slots / slots, 6) if slots else 0.0,
                "empty_rows_written": rows - self.segments,
                "real_steps": self.real_steps, "padded_steps": rows * U,
                "padding_efficiency": round(self.real_steps / (rows * U), 6) if rows else 1.0,
                "max_sequence_count": self.max_sequence_count, "world_size": plan.options.world_size,
                "batches_per_rank": self.batches // plan.options.world_size, "empty_batches": self.empty_batches}


class LanePlanner:
    """Assigns examples to lanes and cuts the lanes' segment streams into batches.

    Examples are read in input order in windows of LANE_WINDOW * B; whenever a lane has
    nothing queued, the next window is assigned longest-first (ties: input order) onto the
    lane with the fewest queued segments (ties: lowest lane), i.e. LPT with the queues left
    over as initial loads. Memory holds a window plus what the lanes have queued. With
    world_size N there are N * B lanes: rank r's are lanes r * B .. r * B + B - 1.
    """

    def __init__(self, plan: SegmentPlan, batch_bytes: float = 0.0) -> None:
        self.plan = plan
        B = plan.options.batch_size * plan.options.world_size
        self.lanes: list[deque[list]] = [deque() for _ in range(B)]
        self.load = np.zeros(B, dtype=np.int64)
        self.stats = SegmentStats()
        self.window = LANE_WINDOW * B
        self.item_batches = max(1, min(ITEM_SEGMENTS // B, int(ITEM_BYTES // max(batch_bytes, 1.0))))

    def items(self, examples: Iterable[Examples]) -> Iterator[SegmentItem]:
        windows = self._windows(examples)
        exhausted = False
        builder = _ItemBuilder(self.item_batches, len(self.lanes), 0)
        while True:
            while not exhausted and not self.load.all():
                window = next(windows, None)
                if window is None:
                    exhausted = True
                else:
                    self._assign(window)
            if not self.load.any():
                break
            k = int(self.load.min()) if not exhausted else int(self.load[self.load > 0].min())
            k = min(k, builder.room)
            self._emit(builder, k)
            if not builder.room:
                yield builder.finish()
                builder = _ItemBuilder(self.item_batches, len(self.lanes), builder.first_batch + builder.filled)
        if builder.filled:
            yield builder.finish()

    def _windows(self, examples: Iterable[Examples]) -> Iterator[list[tuple[Examples, np.ndarray]]]:
        """Windows of `self.window` consecutive examples, as (chunk, rows) pieces."""
        ordinal = 0
        window: list[tuple[Examples, np.ndarray]] = []
        size = 0
        for ex in examples:
            ex = replace(ex, first_ordinal=ordinal)
            ordinal += ex.num_rows
            self.stats.examples += ex.num_rows
            self.stats.real_steps += int(ex.total_length.sum())
            start = 0
            while start < ex.num_rows:
                take = min(self.window - size, ex.num_rows - start)
                window.append((ex, np.arange(start, start + take)))
                size += take
                start += take
                if size == self.window:
                    yield window
                    window, size = [], 0
        if window:
            yield window

    def _assign(self, window: list[tuple[Examples, np.ndarray]]) -> None:
        refs = [(ex, int(r)) for ex, rows in window for r in rows]
        counts = np.concatenate([ex.count[rows] for ex, rows in window])
        self.stats.max_sequence_count = max(self.stats.max_sequence_count, int(counts.max()))
        heap = [(int(load), lane) for lane, load in enumerate(self.load)]
        heapq.heapify(heap)
        for i in np.argsort(-counts, kind="stable"):
            load, lane = heapq.heappop(heap)
            ex, r = refs[i]
            c = int(counts[i])
            self.lanes[lane].append([ex, r, 0, c])
            heapq.heappush(heap, (load + c, lane))
        for load, lane in heap:
            self.load[lane] = load

    def _emit(self, builder: _ItemBuilder, k: int) -> None:
        """The next k batches: each lane's next k segments (fewer at the very end: empty slots)."""
        filled = np.zeros(len(self.lanes), dtype=np.int64)
        for lane, queue in enumerate(self.lanes):
            t = 0
            while t < k and queue:
                entry = queue[0]
                ex, r, seg, count = entry
                m = min(k - t, count - seg)
                builder.put(t, lane, ex, r, seg, m)
                entry[2] += m
                t += m
                if entry[2] == count:
                    queue.popleft()
                    builder.finished += 1
            self.load[lane] -= t
            self.stats.segments += t
            self.stats.empty_slots += k - t
            filled[lane] = t
        builder.filled += k
        N = self.plan.options.world_size
        self.stats.batches += k * N
        self.stats.empty_batches += int((k - filled.reshape(N, -1).max(axis=1)).sum())


class _ItemBuilder:
    """Slot arrays of one SegmentItem being filled by the planner: it records runs (a lane's m consecutive
    slots playing consecutive segments of one example), expanded into the arrays at once by finish()."""

    def __init__(self, batches: int, lanes: int, first_batch: int) -> None:
        self.first_batch = first_batch
        self.batches = batches
        self.lanes = lanes
        self.filled = 0
        self.finished = 0
        self.runs: list[tuple[int, int, int, int, int, int]] = []
        """(first slot's batch, lane, source, row, first segment, m) per run."""
        self.sources: dict[int, int] = {}
        self.source_list: list[Examples] = []

    @property
    def room(self) -> int:
        return self.batches - self.filled

    def put(self, t: int, lane: int, ex: Examples, row: int, seg: int, m: int) -> None:
        index = self.sources.get(id(ex))
        if index is None:
            index = self.sources[id(ex)] = len(self.source_list)
            self.source_list.append(ex)
        self.runs.append((self.filled + t, lane, index, row, seg, m))

    def finish(self) -> SegmentItem:
        n = self.filled
        src = np.full((n, self.lanes), -1, dtype=np.int32)
        row = np.zeros((n, self.lanes), dtype=np.int64)
        seg = np.zeros((n, self.lanes), dtype=np.int32)
        if self.runs:
            first, lane, source, rows, segs, m = np.array(self.runs, dtype=np.int64).T
            slots = (_ranges(first, m), np.repeat(lane, m))
            src[slots] = np.repeat(source, m)
            row[slots] = np.repeat(rows, m)
            seg[slots] = _ranges(segs, m)
        return SegmentItem(self.first_batch, tuple(self.source_list), src, row, seg, self.finished)


# --- building batches (pure, on worker threads) --------------------------------------------------

def build_batches(item: SegmentItem, plan: SegmentPlan) -> list[pa.RecordBatch]:
    """The item's batches, one RecordBatch each (B rows; without empty rows under allow_small_batch).

    With world_size N each step of the planner's N * B lanes is cut into N batches, rank by rank."""
    o = plan.options
    U = o.num_unroll
    N = o.world_size
    n, lanes = item.src.shape
    B = lanes // N
    empty = (item.src < 0).ravel()
    # an empty slot reads its batch's first real row, so context and state keep their shape (then zeroed)
    first = np.argmax(item.src >= 0, axis=1)
    src = np.where(item.src >= 0, item.src, item.src[np.arange(n), first][:, None]).ravel()
    row = np.where(item.src >= 0, item.row, item.row[np.arange(n), first][:, None]).ravel()
    seg = np.where(empty, 0, item.seg.ravel()).astype(np.int64)
    base = np.cumsum([0] + [s.num_rows for s in item.sources])
    g = base[src] + row

    def per_example(values: Callable[[Examples], np.ndarray]) -> np.ndarray:
        return np.concatenate([values(s) for s in item.sources])[g]

    def column(name: str) -> pa.Array:
        return pa.chunked_array([s.data.column(name) for s in item.sources]).take(pa.array(g)).combine_chunks()

    count = np.where(empty, 0, per_example(lambda s: s.count))
    total = np.where(empty, 0, per_example(lambda s: s.total_length))
    value = np.where(empty, 0, per_example(lambda s: s.value_length))
    ordinal = per_example(lambda s: s.first_ordinal + np.arange(s.num_rows))
    steps = np.clip(value - seg * U, 0, U)
    original = pa.chunked_array([s.keys for s in item.sources], type=pa.string()).take(pa.array(g))
    keys, next_keys = _keys(original.combine_chunks(), seg, count, empty)
    arrays: dict[str, pa.Array] = {
        "key": keys, "next_key": next_keys,
        "sequence": pa.array(seg.astype(np.int32)),
        "sequence_count": pa.array(count.astype(np.int32)),
        "length": pa.array(np.clip(total - seg * U, 0, U).astype(np.int32)),
        "total_length": pa.array(total.astype(np.int32)),
        "insertion_index": pa.array(np.where(empty, EMPTY_INSERTION_INDEX, FIRST_INSERTION_INDEX + ordinal)),
        "lane": pa.array(np.tile(np.arange(B, dtype=np.int32), n * N)),
        "batch": pa.array(np.repeat(np.arange(item.first_batch * N, (item.first_batch + n) * N, dtype=np.int64), B)),
    }
    keep = pa.array(~empty)
    for name in o.context:
        arrays[name] = _zero_where(column(name), keep)
    for name in o.sequences:
        arrays[name] = _segments(item, name, src, row, seg, steps, plan)
    first_segment = pa.array(~empty & (seg == 0))
    for name, col in o.states.items():
        arrays[name] = _zero_where(column(col), first_segment)
    table = pa.RecordBatch.from_arrays([arrays[f.name] for f in plan.schema], schema=plan.schema)
    batches = [table.slice(t * B, B) for t in range(n * N)]
    if o.allow_small_batch:
        # a batch with no real row keeps its empty rows, so every rank still gets a batch at this step
        real = ~empty.reshape(n * N, B)
        batches = [b if real[t].all() or not real[t].any() else b.filter(pa.array(real[t]))
                   for t, b in enumerate(batches)]
    return batches


def _segments(item: SegmentItem, name: str, src: np.ndarray, row: np.ndarray, seg: np.ndarray,
              steps: np.ndarray, plan: SegmentPlan) -> pa.Array:
    """Each slot's `steps` real values of its segment, padded to num_unroll steps."""
    U = plan.options.num_unroll
    flats, starts = zip(*(list_values(source.data.column(name)) for source in item.sources))
    begin = np.concatenate([offsets[:-1] for offsets in starts])[
        np.cumsum([0] + [s.num_rows for s in item.sources])[src] + row] + seg * U
    return padded_list(flats, src, begin, steps, U, plan.pad_values[name], plan.schema.field(name).type.value_field)


def _keys(original: pa.Array, seg: np.ndarray, count: np.ndarray, empty: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """key = '%05d_of_%05d:%s' % (sequence, sequence_count, key); next_key = the next one, or 'STOP:%s' % key."""
    def number(values: np.ndarray) -> pa.Array:
        return pc.utf8_lpad(pc.cast(pa.array(values.astype(np.int64)), pa.string()), 5, "0")

    of_count = number(count)
    key = pc.binary_join_element_wise(number(seg), "_of_", of_count, ":", original, "")
    following = pc.binary_join_element_wise(number(seg + 1), "_of_", of_count, ":", original, "")
    stop = pc.binary_join_element_wise("STOP:", original, "")
    next_key = pc.if_else(pa.array(seg + 1 >= count), stop, following)
    real = pa.array(~empty)
    return pc.if_else(real, key, ""), pc.if_else(real, next_key, "")


def _zero_where(arr: pa.Array, keep: pa.Array) -> pa.Array:
    """arr where keep, else a zero of the same shape (0, False, '' or a list of those of the same length)."""
    return pc.if_else(keep, arr, _zeros_like(arr))


def _zeros_like(arr: pa.Array) -> pa.Array:
    t = arr.type
    if is_sequence_type(t):
        values, offsets = list_values(arr)
        zeros = _zeros_like(values)
        if pa.types.is_fixed_size_list(t):
            return pa.FixedSizeListArray.from_arrays(zeros, type=t)
        if pa.types.is_large_list(t):
            return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), zeros, type=t)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), zeros, type=t)
    try:
        return pc.fill_null(pa.nulls(len(arr), t), pa.scalar(default_pad(t), t))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        return pa.nulls(len(arr), t)  # types with no zero (structs, ...) stay null


# --- the command ------------------------------------------------------------------------------------

@with_engine
def segment(src: str, dst: str, options: SegmentOptions, output: OutputOptions, *, format: str | None = None,
            skip_corrupt: bool = False, run: RunSettings = RunSettings(), memory: int = DEFAULT_MEMORY,
            tmp_dir: str | None = None) -> JobResult:
    """Segment SRC into lane-stable batches of num_unroll-step segments in DST, with the manifest."""
    dataset = open_source(src, dst, output, tmp_dir=tmp_dir, format=format, skip_corrupt=skip_corrupt)
    return write_segmented(dataset, options, dst, output, run, memory=memory, tmp_dir=tmp_dir)


def check_memory(options: SegmentOptions, sample: pa.RecordBatch | None, memory: int) -> float:
    """Stop before planning if one padded batch, or the lanes with their window of examples, would not fit
    the budget (sized from a sample chunk); returns the bytes of one padded batch."""
    B, U = options.batch_size, options.num_unroll
    per_row, per_step = budget.row_bytes(sample, options.sequences)
    batch = B * (U * per_step + per_row + METADATA_BYTES)
    budget.check(f"--num-unroll {U} with --batch-size {B}: one batch of {B:,} segments padded to {U:,} steps",
                 batch, memory, "give a smaller --num-unroll or --batch-size, or a larger --memory")
    example = sample.nbytes / sample.num_rows if sample is not None and sample.num_rows else 0.0
    budget.check(f"--batch-size {B}: {B:,} lanes, each planning {LANE_WINDOW} examples ahead",
                 B * (LANE_BYTES + LANE_WINDOW * example), memory, "give a smaller --batch-size or a larger --memory")
    return batch


def write_segmented(dataset: Dataset, options: SegmentOptions, dst: str, output: OutputOptions, run: RunSettings, *,
                    memory: int = DEFAULT_MEMORY, tmp_dir: str | None = None,
                    write: Callable[..., JobResult] = write_job) -> JobResult:
    """The one pass: check, plan lanes, build and write batches (`write` is write_job, or a pipeline's wrapper)."""
    options = options.with_context(dataset.schema)
    columns = dataset.check_columns(options.source_columns)
    plan = make_plan(dataset.projected_schema(columns), options)
    report = ReadReport()
    sample = next(iter(dataset.tasks(columns)), None)
    planner = LanePlanner(plan, check_memory(options, sample().data if sample else None, memory))
    index = KeyIndex(max(1 << 20, memory // 4), tmp_dir)

    def examples() -> Iterator[Examples]:
        yield from ordered_map(lambda task: prepare_chunk(task(), plan, dataset.locate),
                               dataset.tasks(columns, report), run.threads)

    def checked() -> Iterator[Examples]:
        for ex in examples():
            index.add(ex.key_hash, ex.ids)
            yield ex
        check_unique_keys(index, dataset, options.key, run.threads)

    def work(item: SegmentItem) -> tuple[list[pa.RecordBatch], int]:
        return build_batches(item, plan), item.finished

    try:
        return write(command="segment", options={**options.manifest_options(), "memory": memory},
                     seed=None, dataset=dataset, dst=dst,
                     output=replace(output, sequence_columns=tuple(options.sequences)),
                     schema=plan.schema, items=planner.items(checked()), work=work,
                     stats=lambda: planner.stats.as_dict(plan), run=run, report=report)
    finally:
        index.close()
