"""TFRecord input never loses a record or feature silently, and never lets a file decide how much memory is used."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchtool.io.formats.example import Example, SequenceExample, encode_records
from batchtool.io.formats.tfrecord.framing import frame_record, frame_records, masked_crc
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter
from batchtool.core.synthetic import make_table
import memlimit
from conftest import read_dir


def one_error_line(result) -> str:
    """The single `error:` line a failed command printed."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def write_records(path: Path, payloads: list[bytes]) -> Path:
    with TFRecordFileWriter(str(path), "GZIP" if path.name.endswith(".gz") else None) as writer:
        writer.write_many(payloads)
    return path


# --- --skip-corrupt: resynchronising, exact counts -------------------------------------------------

@pytest.fixture(scope="module")
def records_200() -> tuple[pa.Table, list[bytes]]:
    table = make_table(200, seed=11)
    return table, encode_records(table.to_batches()[0])


@pytest.mark.parametrize("name", ["c.tfrecord", "c.tfrecord.gz"])
def test_a_bad_length_crc_loses_one_record_not_the_rest_of_the_file(tmp_path, run_cli, records_200, name):
    table, payloads = records_200
    framed = bytearray(frame_records(payloads))
    start = len(frame_records(payloads[:10]))
    framed[start + 9] ^= 0x04  # record 10's length CRC
    path = tmp_path / name
    path.write_bytes(gzip.compress(bytes(framed)) if name.endswith(".gz") else bytes(framed))

    line = one_error_line(run_cli("convert", path, tmp_path / "stopped"))
    assert line.startswith(f"error: {path}, record 10: length CRC mismatch")
    assert f"(record starts at byte offset {start}" in line and not (tmp_path / "stopped").exists()

    result = run_cli("convert", path, tmp_path / "dst", "--skip-corrupt")
    assert result.exit_code == 0, result.stderr
    lost = len(frame_record(payloads[10]))
    assert result.stderr.startswith("convert: 199 rows in, 199 out\nwrote 199 rows in ")
    assert result.stderr.strip().endswith(f" MiB (1 corrupt record, {lost:,} bytes skipped)")
    keys = table.column("key").to_pylist()
    assert read_dir(str(tmp_path / "dst")).column("key").to_pylist() == keys[:10] + keys[11:]
    stats = json.loads((tmp_path / "dst" / ".batchtool_manifest.json").read_text())["stats"]
    assert (stats["rows_in"], stats["corrupt_records_skipped"], stats["corrupt_bytes_skipped"]) == (199, 1, lost)
    assert "record 10: length CRC mismatch" in stats["corrupt_record_errors"][0]


@pytest.mark.parametrize("command", [["shuffle"], ["stratify", "--target", "uniform", "--replacement"],
                                     ["bucket", "--auto-buckets", "2", "--batch-size", "8"],
                                     ["segment", "--key", "key", "--sequence", "tokens", "--num-unroll", "5",
                                      "--batch-size", "4"]])
def test_every_command_says_what_it_skipped(tmp_path, run_cli, records_200, command):
    _, payloads = records_200
    framed = bytearray(frame_records(payloads))
    framed[len(frame_records(payloads[:3])) + 12] ^= 0x01  # record 3's data
    path = tmp_path / "c.tfrecord"
    path.write_bytes(bytes(framed))
    name, *options = command
    result = run_cli(name, path, tmp_path / "dst", *options, "--skip-corrupt")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip().endswith(f" (1 corrupt record, {len(frame_record(payloads[3])):,} bytes skipped)")


def test_a_cut_short_last_record_is_counted_in_bytes(tmp_path, run_cli, records_200):
    _, payloads = records_200
    path = tmp_path / "t.tfrecord"
    path.write_bytes(frame_records(payloads)[:-100])
    assert "record 199: truncated" in one_error_line(run_cli("convert", path, tmp_path / "stopped"))
    result = run_cli("convert", path, tmp_path / "dst", "--skip-corrupt", "-q")
    assert result.exit_code == 0, result.stderr
    stats = json.loads((tmp_path / "dst" / ".batchtool_manifest.json").read_text())["stats"]
    assert (stats["rows_out"], stats["corrupt_records_skipped"], stats["corrupt_bytes_skipped"]) == \
        (199, 1, len(frame_record(payloads[199])) - 100)


# --- --max-record-bytes: checked before anything is read -----------------------------------------

_MEMORY_LIMIT = 640 << 20
"""RSS the capped child may reach in all: its imports take about 100 MB, and the allocator keeps part of what a
case freed for the next (up to about 220 MB measured), so each case is judged by its own growth."""
_GROWTH_LIMIT = 300 << 20
"""What one conversion may add to what its process held: a 4 MB record of the tiniest elements protobuf has takes
up to about 60 times its size as it is decoded (240 MB measured), a refused one next to nothing."""


def header(length: int) -> bytes:
    """A record header claiming `length` bytes of data, its length CRC valid."""
    size = length.to_bytes(8, "little")
    return size + masked_crc(size).to_bytes(4, "little")


def gzip_bomb(path: Path, head: bytes, zeros: int) -> Path:
    """A gzip file of `head` and then `zeros` zero bytes: many identical members, so it is quick to make."""
    member = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = member.compress(bytes(16 << 20)) + member.flush()
    first = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(first.compress(head) + first.flush())
        for _ in range(zeros >> 24):
            f.write(block)
    return path


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> dict[str, tuple[Path, memlimit.CliCase]]:
    """Every conversion of this module that a file could make allocate without bound, in one child capped at
    _MEMORY_LIMIT (each case's own peak measured): case -> (its input, how `batchtool convert` ended).

    A huge header: on a sparse file (3 GB on paper, a few KB on disk) and at the start of a gzip bomb (1 GB of zeros in
    ~1 MB); a header within the limit over the bomb's zeros; a record of millions of the smallest elements protobuf
    has, for each of TINY's shapes. Each input in a directory of its own, with its DST beside it."""
    root = tmp_path_factory.mktemp("capped")
    inputs: dict[str, Path] = {}
    for case in ["sparse", "gzip-bomb", "bomb under the limit", *sorted(TINY)]:
        (root / case).mkdir()
        if case == "sparse":
            inputs[case] = root / case / "sparse.tfrecord"
            with open(inputs[case], "wb") as f:
                f.write(header(1 << 60))
                f.truncate(3 << 30)
        elif case in TINY:
            inputs[case] = write_records(root / case / "tiny.tfrecord", [TINY[case](4 << 20)])
        else:
            claimed = 1 << 60 if case == "gzip-bomb" else 12 << 20
            inputs[case] = gzip_bomb(root / case / "bomb.tfrecord.gz", header(claimed), 1 << 30)
    ran = memlimit.cli_cases({case: ["convert", path, path.parent / "dst", *(["-q"] if case in TINY else [])]
                              for case, path in inputs.items()}, _MEMORY_LIMIT)
    return {case: (path, ran[case]) for case, path in inputs.items()}


@pytest.mark.parametrize("kind", ["sparse", "gzip-bomb"])
def test_a_huge_record_header_is_refused_before_reading_it(capped, kind):
    path, run = capped[kind]
    assert run.code == 2 and run.crash is None, run
    assert run.stderr == (f"error: {path}, record 0: the record header at byte offset 0"
                          f"{' of the decompressed stream' if kind == 'gzip-bomb' else ''} claims "
                          f"1,152,921,504,606,846,976 bytes of data, more than the limit of 16,777,216 "
                          "(--max-record-bytes); raise --max-record-bytes if the record is genuine\n")
    assert run.grew_bytes < _GROWTH_LIMIT, run
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_a_gzip_bomb_under_the_limit_is_read_in_bounded_memory(capped):
    """A header within the limit over a stream of zeros: no more than the claimed length is read."""
    path, run = capped["bomb under the limit"]
    assert run.code == 2 and f"error: {path}, record 0: data CRC mismatch" in run.stderr, run
    assert run.grew_bytes < _GROWTH_LIMIT, run


def _field(tag: int, body: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes([tag]) + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _entry(key: bytes, value: bytes) -> bytes:
    return _field(0x0A, _field(0x0A, key) + _field(0x12, value))


TINY = {  # a record of millions of the smallest elements protobuf has: the worst case for decoding
    "int64 steps": lambda n: _field(0x12, _entry(b"s", _field(0x0A, _field(0x1A, _field(0x0A, b"\x05"))) * (n // 7))),
    "empty steps": lambda n: _field(0x12, _entry(b"s", b"\x0a\x00" * (n // 2))),
    "empty strings": lambda n: _field(0x0A, _entry(b"b", _field(0x0A, b"\x0a\x00" * (n // 2)))),
    "1-byte varints": lambda n: _field(0x0A, _entry(b"v", _field(0x1A, _field(0x0A, b"\x05" * n)))),
}


@pytest.mark.parametrize("shape", sorted(TINY))
def test_decoding_a_record_of_tiny_elements_stays_in_bounded_memory(capped, shape):
    _, run = capped[shape]
    assert run.code == 0 and run.crash is None, run
    assert run.grew_bytes < _GROWTH_LIMIT, run


def test_max_record_bytes_is_an_input_option_of_every_reading_command(tmp_path, run_cli):
    path = write_records(tmp_path / "r.tfrecord", encode_records(make_table(20, seed=1).to_batches()[0]))
    line = one_error_line(run_cli("inspect", path, "--max-record-bytes", "100"))
    assert "more than the limit of 100 (--max-record-bytes)" in line
    assert run_cli("inspect", path, "--max-record-bytes", "1MB").exit_code == 0
    for size in ("0", "lots"):
        line = one_error_line(run_cli("convert", path, tmp_path / "d", "--max-record-bytes", size))
        assert line == f"error: --max-record-bytes '{size}': expected a size of at least 1 byte (e.g. 64MB, 1GB)"


# --- schema from every record ---------------------------------------------------------------------

def example(features: dict[str, tuple[str, list]]) -> bytes:
    """A tf.train.Example as TensorFlow serializes it."""
    message = Example()
    for name, (kind, values) in features.items():
        target = getattr(message.features.feature[name], kind)
        target.SetInParent()
        target.value.extend(values)
    return message.SerializeToString()


def test_a_feature_first_seen_at_record_1050_is_a_column(tmp_path, run_cli):
    late = {i: {"late": ("float_list", [i / 2]), "tag": ("bytes_list", [b"t%d" % i])} for i in range(1050, 1100)}
    payloads = [example({"id": ("int64_list", [i]), **late.get(i, {})}) for i in range(1100)]
    path = write_records(tmp_path / "late.tfrecord", payloads)
    result = run_cli("convert", path, tmp_path / "dst", "-q")
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "dst"))
    assert out.schema == pa.schema([("id", pa.int64()), ("late", pa.float32()), ("tag", pa.string())])
    assert out.column("late").to_pylist() == [None] * 1050 + [i / 2 for i in range(1050, 1100)]
    assert out.column("tag").to_pylist() == [None] * 1050 + [f"t{i}" for i in range(1050, 1100)]


def test_a_feature_list_first_seen_in_a_later_shard_is_a_column(tmp_path, run_cli):
    def sequence(i: int, with_list: bool) -> bytes:
        message = SequenceExample()
        message.context.feature["id"].int64_list.value.append(i)
        if with_list:
            for step in range(i % 3):
                message.feature_lists.feature_list["steps"].feature.add().float_list.value.extend([step, -step])
        return message.SerializeToString()
    os.makedirs(tmp_path / "src")
    write_records(tmp_path / "src" / "a.tfrecord", [sequence(i, False) for i in range(1500)])
    write_records(tmp_path / "src" / "b.tfrecord", [sequence(i, i == 1600) for i in range(1500, 1700)])
    result = run_cli("convert", tmp_path / "src", tmp_path / "dst", "-q")
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "dst"))
    assert out.schema.field("steps").type == pa.list_(pa.list_(pa.float32(), 2))
    steps = out.column("steps").to_pylist()
    assert steps[1600 - 1500 + 1500] == [[0.0, -0.0]] and steps.count(None) == 1699


def test_records_that_disagree_on_a_kind_are_an_error_naming_both(tmp_path, run_cli):
    payloads = [example({"x": ("int64_list", [1])})] * 1070 + [example({"x": ("float_list", [0.5])})]
    path = write_records(tmp_path / "k.tfrecord", payloads)
    assert one_error_line(run_cli("convert", path, tmp_path / "dst")) == (
        f"error: {path}, record 1070, column 'x': holds float_list, but earlier values of this feature are "
        f"int64_list (first at {path}, record 0); one column holds one type")


def test_later_records_widen_a_scalar_and_make_bytes_binary(tmp_path, run_cli):
    payloads = [example({"n": ("int64_list", [i]), "b": ("bytes_list", [b"ok"])}) for i in range(2000)]
    payloads[1999] = example({"n": ("int64_list", [1, 2]), "b": ("bytes_list", [b"\xff"])})
    path = write_records(tmp_path / "w.tfrecord", payloads)
    assert run_cli("convert", path, tmp_path / "dst", "-q").exit_code == 0
    out = read_dir(str(tmp_path / "dst"))
    assert out.schema == pa.schema([("b", pa.binary()), ("n", pa.list_(pa.int64()))])
    assert out.column("n").to_pylist()[-2:] == [[1998], [1, 2]]


# --- empty records -----------------------------------------------------------------------------------

def test_only_empty_records_is_an_error_not_an_empty_output(tmp_path, run_cli):
    path = write_records(tmp_path / "e.tfrecord", [b""] * 5)
    assert one_error_line(run_cli("convert", path, tmp_path / "dst")) == (
        f"error: {path}: no features in 5 records, so there are no columns to read (every record is an empty "
        "Example)")
    assert not (tmp_path / "dst").exists()


def test_empty_records_among_others_are_rows_of_nulls(tmp_path, run_cli):
    payloads = [example({"a": ("int64_list", [1])}), b"", example({"a": ("int64_list", [3])}), b""]
    path = write_records(tmp_path / "e.tfrecord", payloads)
    assert run_cli("convert", path, tmp_path / "dst", "-q").exit_code == 0
    assert read_dir(str(tmp_path / "dst")).column("a").to_pylist() == [1, None, 3, None]


# --- lossy output is refused unless asked for ------------------------------------------------------

def test_float64_to_tfrecord_is_refused_unless_cast(tmp_path, run_cli):
    os.makedirs(tmp_path / "src")
    table = pa.table({"d": pa.array([0.1, None], pa.float64()), "f": pa.array([0.5, 1.5], pa.float32()),
                      "seq": pa.array([[0.1, 0.2], []], pa.list_(pa.float64()))})
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    before = sorted(os.listdir(tmp_path))
    line = one_error_line(run_cli("convert", tmp_path / "src", tmp_path / "tfr", "--to", "tfrecord"))
    assert line == ("error: column 'd': double cannot be written to TFRecord exactly (tf.train.FloatList holds "
                    "float32); pass --cast float64=float32 to round it, or write Parquet")
    assert sorted(os.listdir(tmp_path)) == before

    result = run_cli("convert", tmp_path / "src", tmp_path / "tfr", "--to", "tfrecord", "--cast", "float64=float32",
                     "-q")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "tfr" / ".batchtool_manifest.json").read_text())
    assert manifest["output"]["cast"] == {"d": "double -> float",
                                          "seq": "list<element: double> -> list<element: float>"}
    assert run_cli("convert", tmp_path / "tfr", tmp_path / "back", "-q").exit_code == 0
    back = read_dir(str(tmp_path / "back"))
    assert back.schema == pa.schema([("d", pa.float32()), ("f", pa.float32()), ("seq", pa.list_(pa.float32()))])
    assert back.equals(table.cast(back.schema))
    assert back.column("d").to_pylist()[0] == float(np.float32(0.1))

    line = one_error_line(run_cli("convert", tmp_path / "src", tmp_path / "p", "--cast", "float64=float32"))
    assert line == "error: --cast float64=float32: only TFRecord output narrows values; parquet keeps them exactly"


def test_a_uint64_beyond_int64_is_refused(tmp_path, run_cli):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"u": pa.array([1, 1 << 63], pa.uint64())}), tmp_path / "src" / "part-0.parquet")
    line = one_error_line(run_cli("convert", tmp_path / "src", tmp_path / "tfr", "--to", "tfrecord"))
    assert "row 1, column 'u': a value exceeds the int64 range of tf.train.Int64List (uint64)" in line


# --- a field of the wrong wire type: protobuf sets it aside, batchtool refuses it -----------------------------

def _tagged(number: int, wire_type: int, body: bytes) -> bytes:
    """A field of any wire type: a length-delimited one's body gets its length, the others are raw."""
    return _varint(number << 3 | wire_type) + (_varint(len(body)) + body if wire_type == 2 else body)


_ID = _entry(b"id", _field(0x1A, _field(0x0A, b"\x07")))
WRONG_WIRE_TYPE = {  # record 1050's `label` (or what holds it) with a wire type protobuf sets aside as unknown
    "Feature.int64_list": (_field(0x0A, _entry(b"label", _tagged(3, 0, b"\x05")) + _ID),
                           ", column 'label': Feature.int64_list (field 3) has wire type 0 (varint), expected "
                           "length-delimited"),
    "Int64List.value": (_field(0x0A, _entry(b"label", _field(0x1A, _tagged(1, 5, b"\x05\0\0\0"))) + _ID),
                        ", column 'label': Int64List.value (field 1) has wire type 5 (32-bit), expected "
                        "length-delimited or varint"),
    "FeatureEntry.value": (_field(0x0A, _field(0x0A, _field(0x0A, b"label") + _tagged(2, 0, b"\x05")) + _ID),
                           ", column 'label': FeatureEntry.value (field 2) has wire type 0 (varint), expected "
                           "length-delimited"),
    "FeatureEntry.key": (_field(0x0A, _field(0x0A, _tagged(1, 0, b"\x05") + _field(0x12, b"")) + _ID),
                         ": FeatureEntry.key (field 1) has wire type 0 (varint), expected length-delimited"),
    "Example.features": (_tagged(1, 0, b"\x05"),
                         ": Example.features (field 1) has wire type 0 (varint), expected length-delimited"),
}


@pytest.mark.parametrize("case", sorted(WRONG_WIRE_TYPE))
def test_a_field_of_the_wrong_wire_type_after_record_1024_is_an_error(tmp_path, run_cli, case):
    payloads = [example({"label": ("int64_list", [i % 3]), "id": ("int64_list", [i])}) for i in range(1100)]
    payloads[1050], problem = WRONG_WIRE_TYPE[case]
    path = write_records(tmp_path / "w.tfrecord", payloads)
    assert one_error_line(run_cli("convert", path, tmp_path / "dst")) == f"error: {path}, record 1050{problem}"
    assert not (tmp_path / "dst").exists()


def _sequence(i: int, steps: bytes | None = None) -> bytes:
    """A SequenceExample with context `id` and feature list `frames` of two one-value steps (or `steps` raw)."""
    message = SequenceExample()
    message.context.feature["id"].int64_list.value.append(i)
    for step in range(2):
        message.feature_lists.feature_list["frames"].feature.add().float_list.value.append(float(step))
    if steps is None:
        return message.SerializeToString()
    context = message.context.SerializeToString()
    return _field(0x0A, context) + _field(0x12, _field(0x0A, _field(0x0A, b"frames") + _field(0x12, steps)))


@pytest.mark.parametrize("steps, problem", [
    (_field(0x0A, _field(0x12, _tagged(1, 0, b"\x05"))) * 2,
     "feature list step 0: FloatList.value (field 1) has wire type 0 (varint), expected length-delimited or 32-bit"),
    (_field(0x0A, _field(0x12, _field(0x0A, b"\0\0\0\0"))) + _tagged(1, 5, b"\0\0\0\0"),
     "FeatureList.feature (field 1) has wire type 5 (32-bit), expected length-delimited"),
])
def test_a_feature_list_of_the_wrong_wire_type_is_an_error_with_a_schema_from_the_manifest(tmp_path, run_cli, steps,
                                                                                          problem):
    """With a manifest's schema no scan runs first: the decoder itself refuses what protobuf set aside."""
    write_records(tmp_path / "good.tfrecord", [_sequence(i) for i in range(1100)])
    assert run_cli("convert", tmp_path / "good.tfrecord", tmp_path / "tfr", "--to", "tfrecord", "-q").exit_code == 0
    part = tmp_path / "tfr" / "part-00000.tfrecord"
    write_records(part, [_sequence(i, steps if i == 1050 else None) for i in range(1100)])
    line = one_error_line(run_cli("convert", tmp_path / "tfr", tmp_path / "dst"))
    assert line == f"error: {part}, record 1050, column 'frames': {problem}"
