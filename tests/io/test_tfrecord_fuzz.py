"""Seeded mutations of TFRecord files and of the protobuf inside: every outcome is exact values or one BatchtoolError.

Three layers are damaged: the framing (bit flips, cuts, inserted and deleted bytes, rewritten
lengths), the gzip stream around it, and the Example/SequenceExample payloads re-framed with
good CRCs (so the decoder itself meets the damage). Values read from damaged payloads are
checked against protobuf's own parse of the same bytes; rows read from damaged framing must be
some of the original rows, in order. Nothing may raise anything but a BatchtoolError, hang or
grow memory past what --max-record-bytes allows.
"""

from __future__ import annotations

import gzip
import math
import os
import random
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError

from batchtool.io.dataset import ReadReport
from batchtool.core.errors import BatchtoolError, InputError
from batchtool.io.formats.example import FeatureScan, SequenceExample, decode_records, encode_records, scan_records
from batchtool.io.formats.tfrecord import format as tfrecord_format
from batchtool.io.formats.tfrecord.framing import frame_records
from batchtool.io.formats.tfrecord.records import iter_record_chunks
from batchtool.io.inputs import open_dataset
from batchtool.core.synthetic import make_table
from conftest import REPO

CASES = 1500
LIMIT = 1 << 20
"""--max-record-bytes of the fuzzed reads: a mutated length may claim anything."""


def base_payloads() -> dict[str, list[bytes]]:
    """Small valid inputs of both kinds, with every value kind, lists, feature lists and non-UTF-8 bytes."""
    table = make_table(6, seed=5, median_length=3.0, max_length=6)
    examples = pa.table({
        "label": pa.array([1, 2, None, 4, 5, 6], pa.int64()),
        "name": pa.array(["a", "bé", "", None, "x", "yz"]),
        "blob": pa.array([b"\xff\x00", b"", None, b"\x80", b"ok", b"\xc3"]),
        "vals": pa.array([[0.5, 1.5], [], [2.5], None, [1e30, -0.0, 3.0], [7.0]], pa.list_(pa.float32())),
        "ids": pa.array([[1, 300], [2**40], [], [-1], None, [5, 6, 7]], pa.list_(pa.int64())),
    })
    return {"sequence": encode_records(table.to_batches()[0]),
            "example": encode_records(examples.to_batches()[0], "example")}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random damage to a byte string."""
    if not data:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
    at = rng.randrange(len(data))
    op = rng.choice(["flip", "flip", "cut", "insert", "delete", "varint", "copy"])
    if op == "flip":
        out = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if op == "cut":
        return data[:at]
    if op == "insert":
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))) + data[at:]
    if op == "delete":
        return data[:at] + data[at + rng.randrange(1, 17):]
    if op == "varint":  # a length or value replaced by a long, huge or unterminated varint
        varint = rng.choice([b"\xff\xff\xff\xff\x0f", b"\xff" * 10 + b"\x01", b"\x80" * 12, b"\xfe\xff\xff\xff\xff\x01",
                             bytes([rng.randrange(128, 256)])])
        return data[:at] + varint + data[at + rng.randrange(1, 3):]
    start = rng.randrange(len(data))
    return data[:at] + data[start:start + rng.randrange(1, 33)] + data[at:]


def rewrite_length(framed: bytes, rng: random.Random) -> bytes:
    """A record header's length replaced, its length CRC made valid again: only the data CRC can tell."""
    from batchtool.io.formats.tfrecord.framing import masked_crc
    starts, at = [], 0
    while at + 12 <= len(framed):
        starts.append(at)
        at += 16 + int.from_bytes(framed[at:at + 8], "little")
    start = rng.choice(starts)
    length = rng.choice([0, 1, rng.randrange(1 << 12), LIMIT + 1, 1 << 40, (1 << 64) - 1]).to_bytes(8, "little")
    return framed[:start] + length + masked_crc(length).to_bytes(4, "little") + framed[start + 12:]


def read_all(path: Path, skip_corrupt: bool) -> pa.Table:
    """The whole dataset as the library reads it: schema pass, then every chunk."""
    dataset = open_dataset(str(path), skip_corrupt=skip_corrupt, max_record_bytes=LIMIT)
    return pa.Table.from_batches([chunk.data for chunk in dataset.chunks()], dataset.schema)


def values_of(message: Any, schema: pa.Schema) -> dict[str, Any]:
    """One record's column values as protobuf itself parses it, shaped by our schema (the oracle)."""
    def leaf(kind: pa.DataType, feature: Any) -> list[Any]:
        which = feature.WhichOneof("kind")
        held = list(getattr(feature, which).value) if which else []
        if pa.types.is_string(kind):
            return [v.decode("utf-8") for v in held]
        return held

    row = {}
    for field in schema:
        t, name = field.type, field.name
        lists = message.feature_lists.feature_list
        if name in lists:
            inner = t.value_type
            steps = [leaf(inner.value_type if pa.types.is_list(inner) or pa.types.is_fixed_size_list(inner)
                          else inner, step) for step in lists[name].feature]
            nested = pa.types.is_list(inner) or pa.types.is_fixed_size_list(inner)
            row[name] = steps if nested else [step[0] for step in steps]
        elif name in message.context.feature:
            values = leaf(t.value_type if pa.types.is_list(t) else t, message.context.feature[name])
            row[name] = values if pa.types.is_list(t) else values[0]
        else:
            row[name] = None
    return row


def same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def is_ordered_subset(rows: list[Any], originals: list[Any]) -> bool:
    """rows is originals with some left out, in order."""
    found = iter(originals)
    return all(any(same(row, original) for original in found) for row in rows)


def original_rows(payloads: list[bytes], schema: pa.Schema, kind: str) -> list[Any]:
    """Each original record decoded to `schema`, or None where that schema cannot hold it."""
    out = []
    for payload in payloads:
        try:
            out.append(decode_records([payload], schema, kind, path="x", first_record=0).to_pylist()[0])
        except BatchtoolError:
            out.append(None)
    return out


@contextmanager
def deadline(seconds: float, case: str) -> Iterator[None]:
    """Fail (instead of hanging the suite) if a case takes longer than `seconds`."""
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{case}: took more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cases(payloads: dict[str, list[bytes]]) -> Iterator[tuple[str, str, bytes, Callable[[pa.Table], bool]]]:
    """(case name, file name, file bytes, check of a successful read) for CASES seeded mutations."""
    for case in range(CASES):
        rng = random.Random(case)
        kind = rng.choice(sorted(payloads))
        originals = payloads[kind]
        layer = rng.choice(["payload", "payload", "framing", "length", "gzip"])
        name = f"case {case} ({kind}, {layer})"
        if layer == "payload":
            damaged = list(originals)
            for _ in range(rng.randrange(1, 3)):
                i = rng.randrange(len(damaged))
                damaged[i] = mutate(damaged[i], rng)
            yield name, "f.tfrecord", frame_records(damaged), _matches_protobuf(damaged)
            continue
        framed = frame_records(originals)
        framed = rewrite_length(framed, rng) if layer == "length" else mutate(framed, rng)
        if layer == "gzip":
            yield name, "f.tfrecord.gz", mutate(gzip.compress(frame_records(originals), mtime=0), rng), \
                _some_originals(originals)
        else:
            yield name, "f.tfrecord", framed, _some_originals(originals)


def _matches_protobuf(payloads: list[bytes]) -> Callable[[pa.Table], bool]:
    """A read of re-framed damaged payloads is right if protobuf parses each the same way."""
    def check(table: pa.Table) -> bool:
        try:
            messages = [SequenceExample.FromString(p) for p in payloads]
        except DecodeError:
            return False  # protobuf finds a payload malformed: reading it must have failed
        return same(table.to_pylist(), [values_of(m, table.schema) for m in messages])
    return check


def _some_originals(payloads: list[bytes]) -> Callable[[pa.Table], bool]:
    """A read of damaged framing is right if its rows are original rows, in order (CRCs catch the rest)."""
    def check(table: pa.Table) -> bool:
        kind = "sequence_example" if any(SequenceExample.FromString(p).HasField("feature_lists") for p in payloads) \
            else "example"
        return is_ordered_subset(table.to_pylist(), original_rows(payloads, table.schema, kind))
    return check


def test_mutated_tfrecords_give_exact_values_or_one_batchtool_error(tmp_path):
    payloads = base_payloads()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    outcomes = {"read": 0, "error": 0}
    for name, file_name, data, check in cases(payloads):
        path = tmp_path / file_name
        path.write_bytes(data)
        skip = name.endswith(("framing)", "gzip)")) and int(name.split()[1]) % 2 == 0
        with deadline(10, name):
            try:
                table = read_all(path, skip_corrupt=skip)
            except BatchtoolError as exc:
                assert "\n" not in str(exc), name
                outcomes["error"] += 1
            else:
                assert check(table), f"{name}: read values that are not the input's"
                outcomes["read"] += 1
        path.unlink()
    assert min(outcomes.values()) > CASES // 10, outcomes  # the damage is neither always caught nor always missed
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - peak_before
    assert grown < 200 << 20, f"peak memory grew by {grown >> 20} MB"


def test_the_cli_turns_mutated_input_into_one_error_line(tmp_path, run_cli):
    payloads = base_payloads()
    failing = []
    for name, file_name, data, _ in cases(payloads):
        path = tmp_path / f"{len(failing)}-{file_name}"
        path.write_bytes(data)
        try:
            read_all(path, skip_corrupt=False)
            path.unlink()
        except BatchtoolError:
            failing.append(path)
        if len(failing) == 12:
            break
    for path in failing[:10]:
        result = run_cli("convert", path, tmp_path / "dst")
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.stderr
        assert not (tmp_path / "dst").exists()
    for path in failing[10:]:  # a real process: no traceback, whatever the damage
        proc = subprocess.run([sys.executable, "-m", "batchtool", "convert", str(path), str(tmp_path / "dst")],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in failing)


@pytest.mark.parametrize("payload", [b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x80\x80\x80\x80\x10" + b"\x00" * 10,
                                     b"\x0a\x06\x0a\x04\x0a\x02\x0a\xff"])
def test_claimed_lengths_inside_a_payload_allocate_nothing(tmp_path, payload):
    """A protobuf length far beyond the record is an error about the record, not an allocation."""
    path = tmp_path / "p.tfrecord"
    path.write_bytes(frame_records([payload]))
    with pytest.raises(BatchtoolError, match="record 0"):
        read_all(path, skip_corrupt=True)


def _outcome(read: Callable[[], Any]) -> Any:
    """What read() returns, or the type and message of the BatchtoolError it raises."""
    try:
        return read()
    except BatchtoolError as exc:
        return type(exc), str(exc)


def _chunks(chunks: Callable[[ReadReport], Iterator[Any]]) -> tuple:
    """Every chunk's rows and ids, and what was skipped."""
    report = ReadReport()
    return [(chunk.data.to_pylist(), chunk.ids.tolist()) for chunk in chunks(report)], report.stats()


def _scanned_in_order(path: str, skip_corrupt: bool) -> tuple[pa.Schema, str]:
    """The schema pass as one reader going through the file would make it (the oracle of the pass's steps)."""
    scan = FeatureScan()
    for first, payloads in iter_record_chunks(path, tfrecord_format.SCAN_RECORDS,
                                              chunk_bytes=tfrecord_format.SCAN_BYTES, skip_corrupt=skip_corrupt,
                                              max_record_bytes=LIMIT):
        scan = scan.merge(scan_records(payloads, path=path, first_record=first))
    if not scan.records:
        raise InputError(f"{path}: empty input: no TFRecord records to infer a schema from")
    return scan.schema("auto", path)


def test_read_tasks_of_offsets_read_what_a_reader_in_file_order_reads(tmp_path, monkeypatch):
    """The read tasks and schema pass steps that frame their records where they run (offsets from a pass over the
    headers) give the same chunks, ids, skipped-record accounts, schema and first error as reading each file in
    order, whatever the damage to the framing or the payloads; chunks are made tiny so the damage falls on their
    boundaries too."""
    for name, size in (("CHUNK_RECORDS", 2), ("CHUNK_BYTES", 60), ("SCAN_RECORDS", 2), ("SCAN_BYTES", 60)):
        monkeypatch.setattr(tfrecord_format, name, size)
    schemas = {}
    for kind, originals in base_payloads().items():
        (tmp_path / f"{kind}.tfrecord").write_bytes(frame_records(originals))
        schemas[kind] = open_dataset(str(tmp_path / f"{kind}.tfrecord")).schema
    compared = 0
    for name, file_name, data, _ in cases(base_payloads()):
        if file_name.endswith(".gz") or compared == 100:
            continue
        compared += 1
        path = tmp_path / file_name
        path.write_bytes(data)
        kind = name.split("(")[1].split(",")[0]
        for skip in (False, True):
            dataset = open_dataset(str(path), schema=schemas[kind], skip_corrupt=skip, max_record_bytes=LIMIT,
                                   options={"tfrecord_kind": "example" if kind == "example" else "sequence_example"})
            in_tasks = _outcome(lambda: _chunks(lambda report: (task() for task in dataset.tasks(report=report))))
            in_order = _outcome(lambda: _chunks(lambda report: (chunk for file in dataset.spec.file_tasks(dataset, None)
                                                                for chunk in file(report))))
            assert in_tasks == in_order, f"{name}, skip_corrupt={skip}"
            assert (_outcome(lambda: open_dataset(str(path), skip_corrupt=skip, max_record_bytes=LIMIT).schema)
                    == _outcome(lambda: _scanned_in_order(str(path), skip)[0])), f"{name}, schema pass"
