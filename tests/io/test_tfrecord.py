"""TFRecord framing: round trips, known CRCs, every corruption case, skipping, chunking and GZIP."""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES, check_record_limit
from batchtool.core.errors import CorruptRecordError, InputError, UsageError
from batchtool.io.formats.example import encode_records
from batchtool.io.formats.tfrecord import records as record_reading
from batchtool.io.formats.tfrecord.framing import frame_record, frame_records, masked_crc
from batchtool.io.dataset import Skipped
from batchtool.io.formats.tfrecord.records import Span, iter_record_chunks, iter_record_spans, iter_records
from batchtool.io.formats.tfrecord.stream import detect_compression
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter

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


def skipping(path: Path, **kwargs) -> tuple[list[bytes], list[Skipped]]:
    """The records read with skip_corrupt, and what was reported skipped."""
    seen: list[Skipped] = []
    return list(iter_records(str(path), skip_corrupt=True, on_corrupt=seen.append, **kwargs)), seen


def test_skip_corrupt_skips_bad_data_and_counts(tmp_path: Path) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[1] + 12)
    flip(path, offsets(PAYLOADS)[3] + 12 + 7)
    records, seen = skipping(path)
    assert records == [PAYLOADS[0], PAYLOADS[2], PAYLOADS[4]]
    assert [(s.records, s.bytes) for s in seen] == [(1, 16 + len(PAYLOADS[1])), (1, 16 + len(PAYLOADS[3]))]
    assert "record 1" in str(seen[0].error) and "record 3" in str(seen[1].error)
    assert all("data CRC mismatch" in str(s.error) for s in seen)
    assert list(iter_records(str(path), skip_corrupt=True)) == records


@pytest.mark.parametrize("position", [0, 3, 7, 8, 11])
def test_a_bad_length_crc_resynchronises_at_the_next_good_record(tmp_path: Path, position: int) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[2] + position)
    records, seen = skipping(path)
    assert records == PAYLOADS[:2] + PAYLOADS[3:]
    (skipped,) = seen
    assert (skipped.records, skipped.bytes) == (1, 16 + len(PAYLOADS[2]))
    message = str(skipped.error)
    assert "record 2: length CRC mismatch" in message
    assert f"(record starts at byte offset {offsets(PAYLOADS)[2]}); skipped 316 bytes to the next record whose " \
           f"CRCs check out, at byte offset {offsets(PAYLOADS)[3]}" in message


def test_resynchronising_counts_damaged_records_it_passes(tmp_path: Path) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[1] + 9)  # record 1: its length can no longer be trusted
    flip(path, offsets(PAYLOADS)[2] + 12 + 5)  # record 2: a good header, damaged data
    records, seen = skipping(path)
    assert records == [PAYLOADS[0], *PAYLOADS[3:]]
    assert [(s.records, s.bytes) for s in seen] == [(2, offsets(PAYLOADS)[3] - offsets(PAYLOADS)[1])]


def test_a_chance_length_crc_match_is_not_trusted_without_the_data_crc(tmp_path: Path) -> None:
    decoy = frame_record(b"decoy")[:12] + b"not the data"  # a valid header whose data CRC fails
    payloads = [b"a" * 40, b"b" * 40 + decoy + b"c" * 40, b"d" * 40]
    path = write(tmp_path / "d.tfrecord", payloads)
    flip(path, offsets(payloads)[1] + 10)
    records, seen = skipping(path)
    assert records == [payloads[0], payloads[2]]
    assert [(s.records, s.bytes) for s in seen] == [(2, 16 + len(payloads[1]))]


def test_nothing_good_after_lost_framing_skips_to_the_end(tmp_path: Path) -> None:
    path = write(tmp_path / "s.tfrecord", PAYLOADS)
    flip(path, offsets(PAYLOADS)[4] + 2)
    records, seen = skipping(path)
    assert records == PAYLOADS[:4]
    assert [(s.records, s.bytes) for s in seen] == [(1, 16 + len(PAYLOADS[4]))]
    assert "skipped 20 bytes to the end" in str(seen[0].error)


def test_truncated_last_record_is_counted_in_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "t.tfrecord", PAYLOADS)
    path.write_bytes(path.read_bytes()[:-1])
    records, seen = skipping(path)
    assert records == PAYLOADS[:4]
    assert [(s.records, s.bytes) for s in seen] == [(1, 16 + len(PAYLOADS[4]) - 1)]
    assert "record 4" in str(seen[0].error) and "truncated" in str(seen[0].error)
    path.write_bytes(path.read_bytes()[:offsets(PAYLOADS)[4] + 5])
    records, seen = skipping(path)
    assert records == PAYLOADS[:4] and [(s.records, s.bytes) for s in seen] == [(1, 5)]


def test_gzip_resynchronises_and_counts_decompressed_bytes(tmp_path: Path) -> None:
    framed = bytearray(frame_records(PAYLOADS))
    framed[offsets(PAYLOADS)[1] + 9] ^= 0x40
    path = tmp_path / "g.tfrecord.gz"
    path.write_bytes(gzip.compress(bytes(framed)))
    records, seen = skipping(path)
    assert records == [PAYLOADS[0], *PAYLOADS[2:]]
    assert [(s.records, s.bytes) for s in seen] == [(1, 16 + len(PAYLOADS[1]))]
    assert "of the decompressed stream" in str(seen[0].error)


def test_cut_short_gzip_stream_counts_every_byte_it_holds(tmp_path: Path) -> None:
    path = write(tmp_path / "g.tfrecord.gz", PAYLOADS * 40, "GZIP")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CorruptRecordError, match="the gzip stream ends without its end marker"):
        list(iter_records(str(path)))
    held = zlib.decompressobj(31).decompress(data[:len(data) // 2])
    records, seen = skipping(path)
    assert records == (PAYLOADS * 40)[:len(records)]
    assert [s.records for s in seen] == [1]
    assert sum(16 + len(p) for p in records) + seen[0].bytes == len(held)


def test_a_corrupt_gzip_stream_stops_even_when_skipping(tmp_path: Path) -> None:
    path = write(tmp_path / "g.tfrecord.gz", PAYLOADS * 40, "GZIP")
    flip(path, 100)
    with pytest.raises(CorruptRecordError, match="corrupt gzip stream .* --skip-corrupt cannot skip it"):
        skipping(path)


def test_a_record_over_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    path = write(tmp_path / "big.tfrecord", [b"x" * 100, b"y" * 5000, b"z"])
    huge = write(tmp_path / "huge.tfrecord", [b"x"])
    with open(huge, "r+b") as f:  # the header claims one byte more than the default limit
        f.write(struct.pack("<Q", DEFAULT_MAX_RECORD_BYTES + 1))
        f.write(struct.pack("<I", masked_crc(struct.pack("<Q", DEFAULT_MAX_RECORD_BYTES + 1))))
    with pytest.raises(InputError) as info:
        list(iter_records(str(path), max_record_bytes=1000))
    assert str(info.value) == (
        f"{path}, record 1: the record header at byte offset 116 claims 5,000 bytes of data, more than the limit "
        "of 1,000 (--max-record-bytes); raise --max-record-bytes if the record is genuine")
    with pytest.raises(InputError, match="more than the limit"):  # a limit, not corruption: never skipped
        skipping(path, max_record_bytes=1000)
    assert len(list(iter_records(str(path), max_record_bytes=5000))) == 3
    with pytest.raises(InputError, match=f"limit of {DEFAULT_MAX_RECORD_BYTES:,}"):
        list(iter_records(str(tmp_path / "huge.tfrecord")))
    with pytest.raises(UsageError, match="--max-record-bytes 0"):
        check_record_limit(0)


def test_chunks_are_bounded_in_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "c.tfrecord", PAYLOADS)
    sizes = [[len(p) for p in chunk] for _, chunk in iter_record_chunks(str(path), 10, chunk_bytes=300)]
    assert sizes == [[5, 0], [300], [256, 4]]


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


def test_spans_are_the_chunks_as_byte_ranges(tmp_path: Path) -> None:
    path = write(tmp_path / "c.tfrecord", PAYLOADS)
    at = [*offsets(PAYLOADS), len(frame_records(PAYLOADS))]
    assert list(iter_record_spans(str(path), 10, chunk_bytes=300)) == [
        Span(0, 2, at[0], at[2]), Span(2, 1, at[2], at[3]), Span(3, 2, at[3], at[5])]
    flip(path, at[1] + 12)
    flip(path, at[3] + 12)
    assert list(iter_record_spans(str(path), 2)) == [  # data CRCs are the read task's to check
        Span(0, 2, at[0], at[2]), Span(2, 2, at[2], at[4]), Span(4, 1, at[4], at[5])]
    skipped: list[Skipped] = []
    assert list(iter_record_spans(str(path), 2, skip_corrupt=True, on_corrupt=skipped.append)) == [
        Span(0, 1, at[0], at[1]), Span(2, 1, at[2], at[3]), Span(4, 1, at[4], at[5])]
    assert [(s.records, s.bytes) for s in skipped] == [(1, 16), (1, 16 + 256)]


class CountingFile(io.RawIOBase):
    """A file that counts the bytes read from it."""
    def __init__(self, raw: io.RawIOBase, counted: list[int]) -> None:
        self.raw, self.counted = raw, counted
    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.counted.append(len(data))
        return data
    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)
    def close(self) -> None:
        self.raw.close()
        super().close()


def test_the_index_pass_reads_headers_not_payloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payloads = [bytes([i]) * 300_000 for i in range(8)]
    path = write(tmp_path / "big.tfrecord", payloads)
    counted: list[int] = []
    opened = record_reading.open_record_file
    monkeypatch.setattr(record_reading, "open_record_file", lambda *a, **k: CountingFile(opened(*a, **k), counted))
    spans = list(iter_record_spans(str(path), 1024, chunk_bytes=600_000))
    assert [(s.first_record, s.records) for s in spans] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert spans[-1].end == path.stat().st_size
    assert sum(counted) <= 8 * 4096  # one small read per header, of 2.4 MB


def test_a_huge_length_stops_the_index_pass_before_anything_is_allocated(tmp_path: Path) -> None:
    length = (1 << 60).to_bytes(8, "little")
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(frame_records([b"ok"]) + length + masked_crc(length).to_bytes(4, "little") + b"x" * 10)
    with pytest.raises(InputError, match="record 1: the record header at byte offset 18 claims "
                                         "1,152,921,504,606,846,976 bytes of data, more than the limit"):
        list(iter_record_spans(str(path), 10))


def test_a_cut_short_last_record_is_found_by_the_index_pass(tmp_path: Path) -> None:
    path = write(tmp_path / "cut.tfrecord", PAYLOADS)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptRecordError) as spans:
        list(iter_record_spans(str(path), 10))
    assert str(spans.value) == read_error(path) and "record 4: truncated" in str(spans.value)


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


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_one_writer_for_record_files_and_output_shards(tmp_path: Path, compression: str | None) -> None:
    """TFRecordFileWriter (tests, scripts) and the output shards write the same records as the same bytes."""
    from batchtool.io.output import OutputOptions
    batch = pa.RecordBatch.from_pydict({"tokens": [[1, 2, 3], [4]], "label": [0, 1]})
    options = OutputOptions(format="tfrecord", compression=compression)
    shard = io.BytesIO()
    sink = options.spec.open_sink(shard, batch.schema, options)
    sink.write(options.spec.encode(batch, options))
    sink.close()
    path = write(tmp_path / "w.tfrecord", encode_records(batch), compression)
    assert path.read_bytes() == shard.getvalue()


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
