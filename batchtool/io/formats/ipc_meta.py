"""Arrow IPC message metadata read without pyarrow: each record batch's rows and what its compressed buffers
inflate to, from the flatbuffers of the file's footer and messages, so both are known (and checked) before
anything is decompressed.

pyarrow tells neither without decompressing the batch. The flatbuffers Python runtime does not verify what it
reads, so this is a small reader of just the fields needed (Message, RecordBatch, DictionaryBatch,
BodyCompression, Footer, Block), in which every offset followed is checked against the bytes it points into,
every vector's length against the bytes left, and every body against the file's size: a damaged or hostile file
is a MalformedIpc, never a read out of bounds, a loop or an allocation larger than the file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

FILE_MAGIC = b"ARROW1"
CONTINUATION = b"\xff\xff\xff\xff"
"""What every message of the current IPC format starts with (before its metadata length)."""
_U16, _U8, _I32, _U32, _I64 = (struct.Struct(f) for f in ("<H", "<B", "<i", "<I", "<q"))
_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2
"""MessageHeader union members (Message.fbs): Schema 1, DictionaryBatch 2, RecordBatch 3, Tensor 4, ..."""
_HEADER_NAMES = {1: "a schema", 2: "a dictionary batch", 3: "a record batch", 4: "a tensor", 5: "a sparse tensor"}
FILE_TRAILER = 10
"""The file's last bytes: its footer's length (int32) and the magic."""
STRUCT_BYTES = 16
"""FieldNode (length, null_count) and Buffer (offset, length): two int64 each."""
_BLOCK_BYTES = 24
"""Footer Block: offset int64, metaDataLength int32 (+4 padding), bodyLength int64."""
_COMPRESSION_PREFIX = 8
"""A compressed buffer starts with its uncompressed length (int64, little-endian; -1: stored uncompressed)."""


class MalformedIpc(Exception):
    """Metadata that cannot be trusted: what is wrong with it, and which batch (`batch`: 'record batch 3',
    'dictionary batch 0'; None where no batch is known yet), for a one-line error naming the file and the batch."""

    def __init__(self, problem: str, batch: str | None = None) -> None:
        super().__init__(problem)
        self.batch = batch


def _batch_name(kind: int, index: int) -> str:
    return f"{'dictionary' if kind == _DICTIONARY_BATCH else 'record'} batch {index}"


class Flat:
    """One flatbuffer, every read of it bounds-checked (a table's fields, its vtable, the vectors it points to)."""

    def __init__(self, data: bytes, what: str, batch: str | None = None) -> None:
        self.data, self.what, self.batch = data, what, batch
        self._vtables: dict[int, tuple[int, ...]] = {}

    def named(self, batch: str) -> None:
        """From here on, the flatbuffer is known to be `batch`'s metadata (a stream's message, once its kind is read)."""
        self.what, self.batch = "its metadata", batch

    def malformed(self, problem: str) -> MalformedIpc:
        return MalformedIpc(f"{self.what} {problem}", self.batch)

    def read(self, fmt: struct.Struct, at: int) -> int:
        if at < 0 or at + fmt.size > len(self.data):
            raise self.malformed(f"points outside its {len(self.data):,} bytes (at {at})")
        return fmt.unpack_from(self.data, at)[0]

    def root(self) -> int:
        return self.read(_U32, 0)

    def field(self, table: int, slot: int) -> int | None:
        """Where field `slot` of the table at `table` is, or None when it is absent (its default)."""
        offsets = self._vtables.get(table)
        if offsets is None:
            offsets = self._vtables[table] = self._vtable(table)
        offset = offsets[slot] if slot < len(offsets) else 0
        return table + offset if offset else None

    def _vtable(self, table: int) -> tuple[int, ...]:
        """The field offsets the vtable of the table at `table` lists, read once (every field read goes through
        them: the reader of a memory-mapped batch's metadata pays microseconds, not tens)."""
        vtable = table - self.read(_I32, table)
        size = self.read(_U16, vtable)
        if size < 4 or size % 2 or vtable + size > len(self.data):
            raise self.malformed(f"has a vtable of {size} bytes at {vtable}")
        return struct.unpack_from(f"<{(size - 4) // 2}H", self.data, vtable + 4)

    def scalar(self, table: int, slot: int, fmt: struct.Struct, default: int) -> int:
        at = self.field(table, slot)
        return default if at is None else self.read(fmt, at)

    def target(self, table: int, slot: int) -> int | None:
        """The table or vector field `slot` points to, or None when absent."""
        at = self.field(table, slot)
        return None if at is None else at + self.read(_U32, at)

    def structs(self, table: int, slot: int, size: int) -> np.ndarray:
        """A vector of structs of int64 (FieldNode, Buffer, Block) as a (count, size // 8) int64 array."""
        at = self.target(table, slot)
        if at is None:
            return np.zeros((0, size // 8), dtype=np.int64)
        count = self.read(_U32, at)
        if at + 4 + count * size > len(self.data):
            raise self.malformed(f"has a vector of {count:,} entries, more than its bytes hold")
        return np.frombuffer(self.data, dtype="<i8", count=count * size // 8, offset=at + 4).reshape(count, size // 8)


@dataclass(frozen=True)
class Message:
    """One record or dictionary batch of a file: where it is, its rows, and its buffers (offset, length within
    the body: a (count, 2) int64 array, which `inflated` reads the compressed ones' prefixes of)."""

    index: int
    """Its position among the file's record batches (or dictionary batches)."""
    name: str
    """'record batch 3', 'dictionary batch 0': how errors name it."""
    start: int
    """Where its body starts in the file."""
    body: int
    rows: int
    buffers: np.ndarray
    compressed: bool
    variadic: tuple[int, ...] = ()
    """Extra data buffers of each binary/string view column, in order (RecordBatch.variadicBufferCounts)."""


@dataclass(frozen=True)
class IpcLayout:
    """Where a file's batches are: its dictionary batches and record batches, in file order."""

    dictionaries: tuple[Message, ...]
    batches: tuple[Message, ...]

    @property
    def rows(self) -> int:
        return sum(m.rows for m in self.batches)


ReadAt = Callable[[int, int], bytes]
"""(offset, length) -> the file's bytes there (a memory map's slice, or one read of a remote file)."""


def _message(flat: Flat, index: int, start: int, size: int) -> tuple[int, Message]:
    """The header kind and the batch of one Message flatbuffer whose body starts at `start` (the file: `size`);
    a batch is `index` among those of its kind, and every error from here on names it."""
    message = flat.root()
    kind = flat.scalar(message, 1, _U8, 0)
    name = _batch_name(kind, index)
    if kind in (_RECORD_BATCH, _DICTIONARY_BATCH):
        flat.named(name)
    body = flat.scalar(message, 3, _I64, 0)
    if body < 0 or start + body > size:
        raise MalformedIpc(f"a message body of {body:,} bytes at byte {start:,} runs past the end of the file "
                        f"({size:,} bytes)", flat.batch)
    empty = Message(index, name, start, body, 0, np.zeros((0, 2), dtype=np.int64), False)
    if kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return kind, empty
    header = flat.target(message, 2)
    if header is None:
        raise MalformedIpc("a message without its header", name)
    if kind == _DICTIONARY_BATCH:
        header = flat.target(header, 1)  # DictionaryBatch.data: the RecordBatch of the dictionary's values
        if header is None:
            return kind, empty
    rows = flat.scalar(header, 0, _I64, 0)
    if rows < 0:
        raise MalformedIpc(f"a row count of {rows:,}", name)
    buffers = flat.structs(header, 2, STRUCT_BYTES)
    if len(buffers) and ((buffers < 0).any() or (buffers[:, 1] > body - buffers[:, 0]).any()):
        raise MalformedIpc(f"a buffer lies outside its {body:,}-byte body", name)
    compression = flat.target(header, 3)
    if compression is not None and flat.scalar(compression, 1, _U8, 0) != 0:
        raise MalformedIpc("a body compression method other than per buffer", name)
    variadic = flat.target(header, 4)
    counts: tuple[int, ...] = ()
    if variadic is not None:
        n = flat.read(_U32, variadic)
        if variadic + 4 + 8 * n > len(flat.data):
            raise MalformedIpc(f"a vector of {n:,} counts, more than its metadata's bytes hold", name)
        counts = tuple(int(c) for c in np.frombuffer(flat.data, dtype="<i8", count=n, offset=variadic + 4))
    return kind, Message(index, name, start, body, int(rows), buffers, compression is not None, counts)


def _metadata(read_at: ReadAt, at: int, room: int, what: str, batch: str | None = None) -> tuple[Flat, int]:
    """The Message flatbuffer encapsulated at `at` (continuation marker, int32 length, flatbuffer; or, before
    Arrow 0.15, int32 length and flatbuffer) in at most `room` bytes, and the bytes the encapsulation takes;
    `batch`: which batch the footer says it is, if known."""
    head = read_at(at, min(8, room))
    if len(head) >= 4 and head[:4] == CONTINUATION:
        prefix, length = 8, (_I32.unpack_from(head, 4)[0] if len(head) == 8 else -1)
    else:
        prefix, length = 4, (_I32.unpack_from(head, 0)[0] if len(head) >= 4 else -1)
    if length < 0 or prefix + length > room:
        raise MalformedIpc(f"{what} at byte {at:,} claims {length:,} bytes of metadata, more than the "
                        f"{max(room - prefix, 0):,} left", batch)
    return Flat(read_at(at + prefix, length), what, batch), prefix + length


@dataclass(frozen=True)
class Footer:
    """An IPC file's footer: where its dictionary and record batches are ((count, 3) int64 arrays of Blocks:
    offset, metadata length and padding, body length), and where the footer starts (no batch reaches past it)."""

    dictionaries: np.ndarray
    batches: np.ndarray
    end: int


def file_footer(read_at: ReadAt, size: int) -> Footer:
    """The footer of an IPC *file* (magic, stream, footer, footer length, magic): the blocks, not yet followed."""
    if size < len(FILE_MAGIC) + 2 + FILE_TRAILER or read_at(0, 6) != FILE_MAGIC \
            or read_at(size - len(FILE_MAGIC), 6) != FILE_MAGIC:
        raise MalformedIpc("not an Arrow IPC file (no ARROW1 magic at both ends)")
    length = _I32.unpack(read_at(size - FILE_TRAILER, 4))[0]
    footer_start = size - FILE_TRAILER - length
    if length <= 0 or footer_start < 8:
        raise MalformedIpc(f"the footer claims {length:,} bytes, which the file's {size:,} cannot hold")
    footer = Flat(read_at(footer_start, length), "the footer")
    table = footer.root()
    return Footer(footer.structs(table, 2, _BLOCK_BYTES), footer.structs(table, 3, _BLOCK_BYTES), footer_start)


def _block(read_at: ReadAt, footer: Footer, index: int, kind: int) -> tuple[Flat, int]:
    """The metadata flatbuffer of batch `index` (of `kind`) of a file and where its body starts, from its Block."""
    offset, lengths, body = (footer.dictionaries if kind == _DICTIONARY_BATCH else footer.batches)[index].tolist()
    meta = lengths & 0xFFFFFFFF
    meta = meta - (1 << 32) if meta >= 1 << 31 else meta  # the int32 field (the rest is padding)
    what = _batch_name(kind, index)
    if offset < 8 or meta <= 0 or body < 0 or offset + meta + body > footer.end:
        raise MalformedIpc(f"the footer places it outside the file (byte {offset:,}, {meta:,} + {body:,} bytes)", what)
    flat, _ = _metadata(read_at, offset, meta, "its metadata", what)
    return flat, offset + meta


def file_message(read_at: ReadAt, footer: Footer, index: int, kind: int = _RECORD_BATCH) -> Message:
    """Batch `index` of a file (a record batch, or a dictionary batch), from the block its footer gives."""
    flat, start = _block(read_at, footer, index, kind)
    got, message = _message(flat, index, start, footer.end)
    if got != kind:
        raise MalformedIpc(f"the footer points to {_HEADER_NAMES.get(got, 'an unknown message')}", flat.batch)
    return message


def file_inflated(read_at: ReadAt, footer: Footer, index: int) -> int:
    """What decompressing record batch `index` of a file allocates (`inflated`), in O(1): an uncompressed batch
    (every batch of an output written with `--compression none`) is told from the few metadata fields that say so,
    without the parse of its buffers (a reader of memory-mapped batches pays a few microseconds, not tens)."""
    flat, _ = _block(read_at, footer, index, _RECORD_BATCH)
    message = flat.root()
    header = flat.target(message, 2)
    if flat.scalar(message, 1, _U8, 0) == _RECORD_BATCH and header is not None and flat.target(header, 3) is None:
        return 0
    return inflated(read_at, file_message(read_at, footer, index))


def file_layout(read_at: ReadAt, size: int) -> IpcLayout:
    """The batches of an IPC *file*, from its footer."""
    footer = file_footer(read_at, size)
    return IpcLayout(*(tuple(file_message(read_at, footer, i, kind) for i in range(len(blocks)))
                    for kind, blocks in ((_DICTIONARY_BATCH, footer.dictionaries), (_RECORD_BATCH, footer.batches))))


def stream_layout(read_at: ReadAt, size: int, start: int = 0) -> IpcLayout:
    """The batches of an IPC *stream* (messages one after another, up to an end marker or the end of the file),
    walked from `start`."""
    found: dict[int, list[Message]] = {_DICTIONARY_BATCH: [], _RECORD_BATCH: []}
    at = start
    while at < size:
        if read_at(at, min(8, size - at)) in (CONTINUATION + bytes(4), bytes(4)):
            break  # the end-of-stream marker
        flat, used = _metadata(read_at, at, size - at, f"the message at byte {at:,}")
        kind = flat.scalar(flat.root(), 1, _U8, 0)
        kind, message = _message(flat, len(found.get(kind, ())), at + used, size)
        found.get(kind, []).append(message)
        at += used + message.body
    return IpcLayout(tuple(found[_DICTIONARY_BATCH]), tuple(found[_RECORD_BATCH]))


def inflated(read_at: ReadAt, message: Message, buffers: np.ndarray | None = None) -> int:
    """Bytes decompressing the message's buffers (or the subset `buffers` of their indices) allocates: the sum
    of their declared uncompressed lengths; 0 when the body is not compressed (it is read as it is)."""
    if not message.compressed:
        return 0
    chosen = message.buffers if buffers is None else message.buffers[buffers]
    chosen = chosen[chosen[:, 1] > 0]
    if (chosen[:, 1] < _COMPRESSION_PREFIX).any():
        raise MalformedIpc("a compressed buffer shorter than its 8-byte length prefix", message.name)
    total = 0
    for offset in chosen[:, 0].tolist():
        declared = _I64.unpack(read_at(message.start + offset, _COMPRESSION_PREFIX))[0]
        if declared < -1:
            raise MalformedIpc(f"a compressed buffer declares {declared:,} bytes", message.name)
        total += max(declared, 0)
    return total


def field_buffers(schema: pa.Schema, message: Message, columns: Sequence[str]) -> np.ndarray | None:
    """Indices into message.buffers of the buffers of `columns` (what reading only them decompresses), from the
    Arrow columnar layout of each field's type; None when the layout does not account for every buffer of the
    message (then all of them count)."""
    variadic = iter(message.variadic)
    spans: list[tuple[int, int]] = []
    at = 0
    try:
        for field in schema:
            count = _buffer_count(field.type, variadic)
            spans.append((at, count))
            at += count
    except StopIteration:
        return None
    if at != len(message.buffers):
        return None
    wanted = {schema.get_field_index(c) for c in columns}
    return np.array([i for f, (first, count) in enumerate(spans) if f in wanted for i in range(first, first + count)],
                    dtype=np.int64)


def _buffer_count(t: pa.DataType, variadic: Iterator[int]) -> int:
    """Buffers a column of type t has in an IPC record batch, its children's included (Arrow columnar format)."""
    if isinstance(t, pa.ExtensionType):
        return _buffer_count(t.storage_type, variadic)
    if pa.types.is_dictionary(t):
        return 2  # the indices; the values are a dictionary batch
    if pa.types.is_null(t):
        return 0
    if pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        return 2 + next(variadic)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return 3
    children = sum(_buffer_count(t.field(i).type, variadic) for i in range(t.num_fields))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return 3 + children
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return 2 + children
    if pa.types.is_fixed_size_list(t) or pa.types.is_struct(t):
        return 1 + children
    if pa.types.is_union(t):
        return (2 if t.mode == "dense" else 1) + children
    if pa.types.is_run_end_encoded(t):
        return children
    return 2 + children  # validity and values: every fixed-width type
