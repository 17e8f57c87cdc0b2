"""A TFRecord record's framing, without TensorFlow: length, its masked CRC32C, payload, the payload's masked CRC32C;
the test of every offset of a window for a header at once (what resynchronising needs), and framing payloads."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable

import google_crc32c
import numpy as np

HEADER_SIZE = 12
"""A record's header: its payload's length (little-endian uint64) and that length's masked CRC32C."""
FRAMING = HEADER_SIZE + 4
"""Bytes a record's framing adds to its payload: the header and the data CRC."""
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """CRC32C of data, masked as TFRecord stores it (so CRCs of CRCs do not degenerate)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@functools.cache
def _length_crc_tables() -> tuple[int, np.ndarray]:
    """CRC32C of 8 zero bytes, and each 16-bit value's contribution at each of 4 byte pairs.

    CRC32C is affine over GF(2) for a fixed length, so the CRC of any 8 bytes is the zero
    CRC xor one table entry per byte pair: what lets valid_headers test every offset at once.
    Made on first use (about 10 ms), not when a command imports the TFRecord format.
    """
    zero = google_crc32c.value(bytes(8))
    single = np.zeros((8, 256), dtype=np.uint32)
    for position in range(8):
        for value in range(256):
            message = bytearray(8)
            message[position] = value
            single[position, value] = google_crc32c.value(bytes(message)) ^ zero
    pairs = np.arange(1 << 16)
    return zero, np.stack([single[2 * k][pairs & 0xFF] ^ single[2 * k + 1][pairs >> 8] for k in range(4)])


_EMPTY_HEADER_CRC = masked_crc(bytes(8))


def valid_headers(window: memoryview, limit: int) -> np.ndarray:
    """Every offset i where window[i:i + 12] is a record header of at most `limit` bytes whose length CRC checks out."""
    count = len(window) - HEADER_SIZE + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)

    def at_every_byte(dtype: str, offset: int, size: int) -> np.ndarray:
        return np.ndarray((size,), dtype=dtype, buffer=window, offset=offset, strides=(1,))

    lengths = at_every_byte("<u8", 0, count)
    stored = at_every_byte("<u4", 8, count)
    empty = np.flatnonzero((lengths == 0) & (stored == _EMPTY_HEADER_CRC))  # zeroed regions: no CRC work
    at = np.flatnonzero((lengths <= limit) & (lengths > 0))
    pairs = at_every_byte("<u2", 0, count + 6)
    zero, tables = _length_crc_tables()
    crc = np.uint32(zero) ^ tables[0][pairs[at]] ^ tables[1][pairs[at + 2]] ^ tables[2][pairs[at + 4]] \
        ^ tables[3][pairs[at + 6]]
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return np.union1d(empty, at[masked == stored[at]])


def header_is_valid(header: bytes) -> bool:
    """True if 12 bytes form a TFRecord header whose length CRC checks out."""
    return len(header) == HEADER_SIZE and masked_crc(header[:8]) == U32.unpack_from(header, 8)[0]


def frame_record(payload: bytes) -> bytes:
    """One payload framed as a TFRecord record."""
    return frame_records((payload,))


def frame_records(payloads: Iterable[bytes]) -> bytes:
    """Many payloads framed back to back, built with one join."""
    parts: list[bytes] = []
    for payload in payloads:
        length = U64.pack(len(payload))
        parts += (length, U32.pack(masked_crc(length)), payload, U32.pack(masked_crc(payload)))
    return b"".join(parts)
