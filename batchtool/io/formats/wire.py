"""Protobuf wire format walked with NumPy, many messages at once, for the schema pass over every record.

Only what protobuf writers emit for tf.train.Example is handled: length-delimited fields with
one-byte tags. Anything else raises Unusual, and the caller parses those messages with
protobuf instead; so the walk never decides whether odd input is valid, it only goes fast on
ordinary input. `walk` reads one message field by field in plain Python, for saying exactly what is
wrong with one that protobuf parsed only by setting fields aside.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

PAD = bytes(8)
"""Zero bytes to append after the last message, so reading a length never runs off the buffer."""
_LENGTH_BYTES = 5  # a length needs at most 5 varint bytes (< 2**35)
_WIDE = 64
"""Fewer messages than this still going: finish them with protobuf's parser, not round by round."""
_SLICE = 1 << 18
"""Items of a long message handled at a time: bounds the temporaries."""
_MAX_ROUNDS = 16
"""Fields per message walked for messages that are not plain repeated fields (Example has 2 at most)."""


class Unusual(Exception):
    """The messages hold something the walk does not handle; parse them with protobuf instead."""


def read_varints(buf: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The varint at each position (a message length: at most 5 bytes) and its size; None if longer.

    Byte by byte, touching only the varints still going: lengths are nearly always 1-2 bytes.
    """
    values = buf[positions].astype(np.int64)
    sizes = np.ones(len(positions), dtype=np.int64)
    going = np.flatnonzero(values >= 0x80)
    for shift in range(7, 7 * _LENGTH_BYTES, 7):
        if not going.size:
            return values, sizes
        values[going] &= (1 << shift) - 1
        more = buf[positions[going] + sizes[going]].astype(np.int64)
        values[going] |= more << shift
        sizes[going] += 1
        going = going[more >= 0x80]
    return None if going.size else (values, sizes)


def _items_class() -> type:
    """A message of one repeated bytes field 1: parses any plain repeated field, so protobuf splits it."""
    file = descriptor_pb2.FileDescriptorProto(name="batchtool/wire_items.proto", package="batchtool.wire",
                                              syntax="proto3")
    message = file.message_type.add(name="Items")
    message.field.add(name="item", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("batchtool.wire.Items"))


_Items = _items_class()


@dataclass(frozen=True)
class Fields:
    """Fields found in messages: which message holds each, its number, rank in its message, and payload range."""

    owner: np.ndarray
    number: np.ndarray
    rank: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def take(self, mask: np.ndarray) -> Fields:
        return Fields(self.owner[mask], self.number[mask], self.rank[mask], self.start[mask], self.end[mask])

    def numbered(self, number: int) -> Fields:
        return self.take(self.number == number)


def field_at(buf: np.ndarray, at: np.ndarray, tag: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The length-delimited field starting at each position: (its tag, payload start, payload end).

    tag: the one tag every field must have (else Unusual); None accepts any one-byte tag of a
    length-delimited field numbered 1..15.
    """
    tags = buf[at]
    if tag is not None and (tags != tag).any():
        raise Unusual
    if tag is None and (((tags & 0x87) != 2) | (tags < 8)).any():
        raise Unusual
    size = buf[at + 1].astype(np.int64)
    if (size < 0x80).all():
        return tags, at + 2, at + 2 + size
    lengths = read_varints(buf, at + 1)
    if lengths is None:
        raise Unusual
    first = at + 1 + lengths[1]
    return tags, first, first + lengths[0]


def message_fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Fields:
    """Every field of each (short) message buf[starts[i]:ends[i]], one field of every message per round.

    For messages of a few fields (an Example, a map entry); more than _MAX_ROUNDS is Unusual.
    """
    pos = starts.astype(np.int64, copy=True)
    active = np.flatnonzero(pos < ends)
    found: list[tuple[np.ndarray, ...]] = []
    while active.size:
        if len(found) == _MAX_ROUNDS:
            raise Unusual
        tags, first, last = field_at(buf, pos[active], None)
        if (last > ends[active]).any():
            raise Unusual
        found.append((active, (tags >> 3).astype(np.int64), np.full(active.size, len(found)), first, last))
        pos[active] = last
        active = active[last < ends[active]]
    if not found:
        return Fields(*(np.zeros(0, dtype=np.int64) for _ in range(5)))
    return Fields(*(np.concatenate(parts).astype(np.int64, copy=False) for parts in zip(*found)))


def _split(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
           owners: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The rest of a few long repeated fields, split by protobuf's parser, _SLICE items at a time.

    Positions are rebuilt from the item lengths, so anything but field 1 in the message (another
    field, an over-long varint) makes the lengths not add up, and raises Unusual.
    """
    out = []
    for start, end, owner in zip(starts.tolist(), ends.tolist(), owners.tolist()):
        try:
            items = _Items.FromString(buf[start:end].tobytes()).item
        except DecodeError:
            raise Unusual from None
        at = start
        for first in range(0, len(items), _SLICE):
            piece = items[first:first + _SLICE]
            lengths = np.fromiter(map(len, piece), dtype=np.int64, count=len(piece))
            headers = 2 + (lengths >= 1 << 7) + (lengths >= 1 << 14) + (lengths >= 1 << 21) + (lengths >= 1 << 28)
            ends_of_items = at + np.cumsum(headers + lengths)
            out.append((np.full(len(piece), owner), ends_of_items - lengths, ends_of_items))
            at = int(ends_of_items[-1])
        if at != end:
            raise Unusual
    return out


def items(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The elements of messages that are one repeated field 1 (a map, a FeatureList, a BytesList):
    (owner, payload start, payload end) of each, walked one element of every message per round.

    When few messages are still going, their rest is split by protobuf's parser, so one long
    message costs no more than parsing it.
    """
    owner = np.flatnonzero(starts < ends)
    at, stop = starts[owner].astype(np.int64), ends[owner].astype(np.int64)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    while owner.size:
        if owner.size < _WIDE and len(found) >= 2:
            found += _split(buf, at, stop, owner)
            break
        _, first, last = field_at(buf, at, 0x0A)
        if (last > stop).any():
            raise Unusual
        found.append((owner, first, last))
        going = last < stop
        owner, at, stop = owner[going], last[going], stop[going]
    if not found:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    owner, first, last = (np.concatenate(parts).astype(np.int64, copy=False) for parts in zip(*found))
    return owner, first, last


WIRE_TYPES = {0: "varint", 1: "64-bit", 2: "length-delimited", 5: "32-bit"}
"""Protobuf wire types by number (3 and 4, groups, are not used by any message batchtool reads)."""


class MalformedWire(Exception):
    """A message whose fields cannot be walked (cut short, or a group)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at` and where it ends."""
    value = 0
    for shift in range(0, 70, 7):
        if at >= len(data):
            raise MalformedWire("cut short inside a varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
    raise MalformedWire("a varint longer than 10 bytes")


def walk(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Every field of one message: (field number, wire type, its payload: a length-delimited field's bytes, else
    the raw value bytes), in order; MalformedWire where the message cannot be walked."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, end = _varint(data, at)
        elif wire_type == 2:
            length, at = _varint(data, at)
            end = at + length
        elif wire_type in (1, 5):
            end = at + (8 if wire_type == 1 else 4)
        else:
            raise MalformedWire(f"field {number} has wire type {wire_type}, a group")
        if end > len(data):
            raise MalformedWire(f"field {number} runs past the end of its message")
        yield number, wire_type, data[at:end]
        at = end
