"""Arrow IPC files whose record batch claims more than its bytes: a zstd frame of run-length blocks that inflates to
any size (a 2 GiB batch in 64 KB), in the file or the stream format, built without ever holding the data.

pyarrow cannot write such a file without the data in memory, so the messages are flatbuffers built here (a
minimal back-to-front builder, as the flatbuffers library lays them out) around pyarrow's own schema message.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa

_BLOCK = 128 << 10
"""The largest zstd block (Block_Maximum_Size with a 128 KiB window)."""
_V5 = 4
"""MetadataVersion.V5."""


def zstd_zeros(size: int) -> bytes:
    """A zstd frame that decompresses to `size` zero bytes: run-length blocks of 4 bytes per 128 KiB."""
    frame = bytearray(b"\x28\xb5\x2f\xfd" + b"\x00" + bytes([7 << 3]))  # no content size; a 128 KiB window
    left = size
    while True:
        block = min(left, _BLOCK)
        left -= block
        header = (block << 3) | (1 << 1) | (left == 0)  # Block_Size, Block_Type RLE, Last_Block
        frame += header.to_bytes(3, "little") + b"\x00"
        if not left:
            return bytes(frame)


class _Builder:
    """Flatbuffers built back to front: an object's position is counted from the end, so references (unsigned
    offsets) always point forward, and the root is prepended last."""

    def __init__(self) -> None:
        self.data = bytearray()

    def _pad(self, align: int, then: int = 0) -> None:
        self.data[:0] = bytes(-(len(self.data) + then) % align)

    def _prepend(self, raw: bytes, align: int) -> int:
        self._pad(align, len(raw))
        self.data[:0] = raw
        return len(self.data)

    def string(self, text: str) -> int:
        raw = text.encode() + b"\x00"
        self._prepend(raw, 4)
        return self._prepend(struct.pack("<I", len(raw) - 1), 4)

    def structs(self, raw: bytes, count: int) -> int:
        self._prepend(raw, 8)
        return self._prepend(struct.pack("<I", count), 4)

    def offsets(self, targets: list[int]) -> int:
        for target in reversed(targets):
            self._pad(4, 4)
            self._prepend(struct.pack("<I", len(self.data) + 4 - target), 4)
        return self._prepend(struct.pack("<I", len(targets)), 4)

    def table(self, fields: dict[int, tuple[str, int]]) -> int:
        """A table of {slot: (struct format, value)}; format "ref" is an offset to an object built before. Its
        vtable goes right before it, so the table's soffset is the vtable's size."""
        end = len(self.data)
        where = {}
        for slot, (fmt, value) in fields.items():
            if fmt == "ref":
                self._pad(4, 4)
                where[slot] = self._prepend(struct.pack("<I", len(self.data) + 4 - value), 4)
            else:
                where[slot] = self._prepend(struct.pack("<" + fmt, value), struct.calcsize("<" + fmt))
        slots = max(fields) + 1 if fields else 0
        vtable_size = 4 + 2 * slots
        table = self._prepend(struct.pack("<i", vtable_size), 4)
        entries = [table - where[s] if s in where else 0 for s in range(slots)]
        self.data[:0] = struct.pack(f"<HH{slots}H", vtable_size, table - end, *entries)
        return table

    def finish(self, root: int) -> bytes:
        self._pad(8, 4)
        self._prepend(struct.pack("<I", len(self.data) + 4 - root), 4)
        return bytes(self.data)


def _batch_message(rows: int, buffers: list[tuple[int, int]], body: int) -> bytes:
    b = _Builder()
    compression = b.table({0: ("b", 1), 1: ("b", 0)})  # ZSTD, per buffer
    buffer_vector = b.structs(b"".join(struct.pack("<qq", o, n) for o, n in buffers), len(buffers))
    nodes = b.structs(struct.pack("<qq", rows, 0), 1)
    batch = b.table({0: ("q", rows), 1: ("ref", nodes), 2: ("ref", buffer_vector), 3: ("ref", compression)})
    message = b.table({0: ("h", _V5), 1: ("B", 3), 2: ("ref", batch), 3: ("q", body)})
    return b.finish(message)


def _footer(schema_fields: int, blocks: list[tuple[int, int, int]]) -> bytes:
    b = _Builder()
    block_vector = b.structs(b"".join(struct.pack("<qi4xq", *block) for block in blocks), len(blocks))
    dictionaries = b.structs(b"", 0)
    int64 = b.table({0: ("i", 64), 1: ("B", 1)})
    children = b.offsets([])
    name = b.string("x")
    field = b.table({0: ("ref", name), 1: ("B", 1), 2: ("B", 2), 3: ("ref", int64), 5: ("ref", children)})
    fields = b.offsets([field] * schema_fields)
    schema = b.table({1: ("ref", fields)})
    footer = b.table({0: ("h", _V5), 1: ("ref", schema), 2: ("ref", dictionaries), 3: ("ref", block_vector)})
    return b.finish(footer)


def _encapsulated(flatbuffer: bytes) -> bytes:
    padded = flatbuffer + bytes(-len(flatbuffer) % 8)
    return b"\xff\xff\xff\xff" + struct.pack("<i", len(padded)) + padded


def write_bomb(path: Path, inflated: int, stream: bool = False) -> Path:
    """An IPC file (or stream) of one column `x: int64` and one record batch of inflated // 8 zeros, whose data
    buffer is a zstd frame of run-length blocks: about 4 bytes on disk per 128 KiB it inflates to."""
    rows = inflated // 8
    buffer = struct.pack("<q", rows * 8) + zstd_zeros(rows * 8)
    data = buffer + bytes(-len(buffer) % 8)
    message = _encapsulated(_batch_message(rows, [(0, 0), (0, len(buffer))], len(data)))
    schema = pa.schema([("x", pa.int64())]).serialize().to_pybytes()
    if stream:
        path.write_bytes(schema + message + data + b"\xff\xff\xff\xff" + bytes(4))
        return path
    head = b"ARROW1\x00\x00" + schema
    footer = _footer(1, [(len(head), len(message), len(data))])
    path.write_bytes(head + message + data + footer + struct.pack("<i", len(footer)) + b"ARROW1")
    return path
