"""TFRecord framing: round trips, known CRCs, every corruption case, skipping, chunking and GZIP."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from batchtool.errors import CorruptRecordError, InputError, UsageError
from batchtool.formats.tfrecord import (
    TFRecordFileWriter,
    detect_compression,
    frame_record,
    frame_records,
    iter_record_chunks,
    iter_records,
    masked_crc,
)

# b"hello" framed by tf.io.TFRecordWriter (see tests/data/tf_hello.tfrecord).
TF_HELLO = bytes.fromhex("0500000000000000" "eab2043e" "68656c6c6f" "bb1f1c19")
PAYLOADS = [b"first", b"", b"x" * 300, bytes(range(256)), b"last"]


def write(path: Path, payloads: list[bytes], compression: str | None = None) -> Path:
    with TFRecordFileWriter(str(path), compression=compression) as writer:
        writer.write_many(payloads)
    return path


def offsets(payloads: list[bytes]) -> list[int]:
    """Byte offset of each record in an uncompressed file."""
    out, at = [], 0
    for payload in payloads:
        out.append(at)
        at += 16 + len(payload)
    return out


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def read_error(path: Path) -> str:
    with pytest.raises(CorruptRecordError) as info:
        list(iter_records(str(path)))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_masked_crc_matches_tensorflow() -> None:
    assert masked_crc(b"\x05" + bytes(7)) == 0x3E04B2EA
    assert masked_crc(b"hello") == 0x191C1FBB
    assert frame_record(b"hello") == TF_HELLO


def test_round_trip_counts_and_single_join(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord"
    with TFRecordFileWriter(str(path)) as writer:
        writer.write(PAYLOADS[0])
        writer.write_many(PAYLOADS[1:])
        assert writer.records == len(PAYLOADS)
    assert writer.bytes_written == path.stat().st_size == sum(16 + len(p) for p in PAYLOADS)
    assert path.read_bytes() == frame_records(PAYLOADS) == b"".join(map(frame_record, PAYLOADS))
    assert list(iter_records(str(path))) == PAYLOADS
    assert detect_compression(str(path)) is None


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path / "e.tfrecord", [])
    assert path.stat().st_size == 0
    assert list(iter_records(str(path))) == []
    assert detect_compression(str(path)) is None


def test_truncated_header(tmp_path: Path) -> None:
    path = write(tmp_path / "t.tfrecord", PAYLOADS)
    path.write_bytes(path.read_bytes()[:offsets(PAYLOADS)[3] + 5])
    message = read_error(path)
    assert "record 3" in message and "truncated" in message
    assert "needs 12 header bytes, 5 left" in message
    assert f"byte offset {offsets(PAYLOADS)[3]}" in message


def test_truncated_data(tmp_path: Path) -> None:
    path = write(tmp_path / "t.tfrecord", PAYLOADS)
    path.write_bytes(path.read_bytes()[:offsets(PAYLOADS)[2] + 12 + 120])
    message = read_error(path)
    assert "record 2" in message
    assert "truncated: needs 304 bytes (300 data + 4 CRC), 120 left" in message


def test_truncated_data_crc(tmp_path: Path) -> None:
    path = write(tmp_path / "t.tfrecord", PAYLOADS[:1])
    path.write_bytes(path.read_bytes()[:-2])
    assert "record 0" in read_error(path) and "needs 9 bytes (5 data + 4 CRC), 7 left" in read_error(path)


def test_flipped_length_byte(tmp_path: Path) -> None:
    path = write(tmp_path / "l.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[1])
    message = read_error(path)
    assert "record 1" in message and "length CRC mismatch" in message


def test_flipped_length_crc_byte(tmp_path: Path) -> None:
    path = write(tmp_path / "l.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[4] + 9)
    assert "record 4" in read_error(path) and "length CRC mismatch" in read_error(path)


def test_flipped_data_byte(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[2] + 12 + 100)
    message = read_error(path)
    assert "record 2" in message and "data CRC mismatch" in message and "300 bytes" in message


def test_flipped_data_crc_byte(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[1] + 12)
    assert "record 1" in read_error(path) and "data CRC mismatch" in read_error(path)


def test_skip_corrupt_skips_bad_data_and_counts(tmp_path: Path) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[1] + 12)
    flip(path, offsets(PAYLOADS)[3] + 12 + 7)
    seen: list[CorruptRecordError] = []
    records = list(iter_records(str(path), skip_corrupt=True, on_corrupt=seen.append))
    assert records == [PAYLOADS[0], PAYLOADS[2], PAYLOADS[4]]
    assert len(seen) == 2
    assert "record 1" in str(seen[0]) and "record 3" in str(seen[1])
    assert all("data CRC mismatch" in str(err) for err in seen)
    assert list(iter_records(str(path), skip_corrupt=True)) == records


def test_skip_corrupt_stops_at_unsynchronisable_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[2] + 3)
    seen: list[CorruptRecordError] = []
    assert list(iter_records(str(path), skip_corrupt=True, on_corrupt=seen.append)) == PAYLOADS[:2]
    assert len(seen) == 1 and "record 2" in str(seen[0]) and "length CRC mismatch" in str(seen[0])

    path = write(tmp_path / "t.tfrecord", PAYLOADS)
    path.write_bytes(path.read_bytes()[:-1])
    seen.clear()
    assert list(iter_records(str(path), skip_corrupt=True, on_corrupt=seen.append)) == PAYLOADS[:4]
    assert len(seen) == 1 and "record 4" in str(seen[0]) and "truncated" in str(seen[0])


def test_chunks_are_contiguous(tmp_path: Path) -> None:
    path = write(tmp_path / "c.tfrecord", PAYLOADS)
    assert list(iter_record_chunks(str(path), 2)) == [(0, PAYLOADS[:2]), (2, PAYLOADS[2:4]), (4, PAYLOADS[4:])]
    assert list(iter_record_chunks(str(path), 10)) == [(0, PAYLOADS)]
    flip(path, offsets(PAYLOADS)[1] + 12)
    flip(path, offsets(PAYLOADS)[3] + 12)
    chunks = list(iter_record_chunks(str(path), 2, skip_corrupt=True))
    assert chunks == [(0, [PAYLOADS[0]]), (2, [PAYLOADS[2]]), (4, [PAYLOADS[4]])]
    with pytest.raises(UsageError):
        list(iter_record_chunks(str(path), 0))


def test_gzip_round_trip_and_detection(tmp_path: Path) -> None:
    path = write(tmp_path / "g.tfrecord.gz", PAYLOADS, "GZIP")
    assert detect_compression(str(path)) == "GZIP"
    assert gzip.decompress(path.read_bytes()) == frame_records(PAYLOADS)
    assert list(iter_records(str(path))) == PAYLOADS
    assert list(iter_records(str(path), compression="GZIP")) == PAYLOADS
    again = write(tmp_path / "h.tfrecord.gz", PAYLOADS, "gzip")
    assert again.read_bytes() == path.read_bytes()


def test_corrupt_gzip_stream(tmp_path: Path) -> None:
    path = write(tmp_path / "g.tfrecord.gz", PAYLOADS * 20, "GZIP")
    path.write_bytes(path.read_bytes()[:-30])
    message = read_error(path)
    assert "corrupt gzip stream" in message or "truncated" in message
    assert "of the decompressed stream" in message

    path = write(tmp_path / "g2.tfrecord.gz", PAYLOADS, "GZIP")
    flip(path, 40)
    assert "record" in read_error(path)


def test_gzip_magic_in_an_uncompressed_length_is_not_gzip(tmp_path: Path) -> None:
    payload = b"p" * 0x8B1F
    path = write(tmp_path / "m.tfrecord", [payload])
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert detect_compression(str(path)) is None
    assert list(iter_records(str(path))) == [payload]


def test_unknown_compression(tmp_path: Path) -> None:
    path = write(tmp_path / "u.tfrecord", PAYLOADS)
    with pytest.raises(UsageError):
        list(iter_records(str(path), compression="ZSTD"))
    with pytest.raises(UsageError):
        TFRecordFileWriter(str(tmp_path / "v.tfrecord"), compression="ZSTD")


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.tfrecord")
    with pytest.raises(InputError, match="nope.tfrecord: cannot read TFRecord file: No such file"):
        list(iter_records(missing))
    with pytest.raises(InputError):
        detect_compression(missing)
