"""TFRecord through the CLI: corrupt and malformed input, --skip-corrupt, and Parquet <-> TFRecord round trips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtool.exec.convert import convert
from batchtool.io.formats.example import encode_records
from batchtool.io.formats.tfrecord.framing import frame_record
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter
from batchtool.core.run_settings import RunSettings
from batchtool.io.output import OutputOptions
from conftest import SAMPLE, read_dir


def write_tfrecord(path: Path, table: pa.Table) -> list[bytes]:
    payloads = encode_records(table.to_batches()[0], "sequence_example")
    with TFRecordFileWriter(str(path)) as writer:
        writer.write_many(payloads)
    return payloads


def small_table(n: int = 5) -> pa.Table:
    return pa.table({"key": [f"k{i}" for i in range(n)], "label": list(range(n)),
                     "tokens": pa.array([[i] * (i + 1) for i in range(n)], pa.list_(pa.int64()))})


def test_truncated_file_is_an_error_naming_file_and_record(tmp_path, run_cli):
    path = tmp_path / "t.tfrecord"
    write_tfrecord(path, small_table())
    path.write_bytes(path.read_bytes()[:-7])
    result = run_cli("convert", path, tmp_path / "dst")
    assert result.exit_code == 2
    assert f"error: {path}, record 4: truncated" in result.stderr
    assert not (tmp_path / "dst").exists()


def test_crc_mismatch_stops_or_is_skipped_and_counted(tmp_path, run_cli):
    path = tmp_path / "t.tfrecord"
    payloads = write_tfrecord(path, small_table())
    data = bytearray(path.read_bytes())
    second_record_data = len(frame_record(payloads[0])) + 12
    data[second_record_data] ^= 0xFF
    path.write_bytes(bytes(data))
    result = run_cli("convert", path, tmp_path / "dst")
    assert result.exit_code == 2 and "record 1" in result.stderr and "CRC" in result.stderr
    assert not (tmp_path / "dst").exists()

    result = run_cli("convert", path, tmp_path / "dst", "--skip-corrupt")
    assert result.exit_code == 0, result.stderr
    size = len(frame_record(payloads[1]))
    assert result.stderr.endswith(f" (1 corrupt record, {size} bytes skipped)\n")
    manifest = json.load(open(tmp_path / "dst" / ".batchtool_manifest.json"))
    assert manifest["stats"]["corrupt_records_skipped"] == 1
    assert manifest["stats"]["corrupt_bytes_skipped"] == size
    assert read_dir(str(tmp_path / "dst")).column("key").to_pylist() == ["k0", "k2", "k3", "k4"]


def test_malformed_protobuf_names_file_and_record(tmp_path, run_cli):
    path = tmp_path / "t.tfrecord"
    payloads = encode_records(small_table().to_batches()[0], "sequence_example")
    payloads[3] = b"\x0a\xff\xff\xff\x0fgarbage"
    with TFRecordFileWriter(str(path)) as writer:
        writer.write_many(payloads)
    result = run_cli("convert", path, tmp_path / "dst")
    assert result.exit_code == 2
    assert str(path) in result.stderr and "record 3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_wrong_column_type_is_named(tmp_path, run_cli):
    path = tmp_path / "t.tfrecord"
    write_tfrecord(path, small_table())
    result = run_cli("inspect", path, "--label", "key")
    assert result.exit_code == 0  # any type can be counted
    result = run_cli("inspect", path, "--length", "key")
    assert result.exit_code == 2 and "column 'key' is string" in result.stderr


def test_sample_tfrecord_equals_sample_parquet(run_cli, tmp_path):
    from conftest import SAMPLE

    assert run_cli("convert", os.path.join(SAMPLE, "tfrecord"), tmp_path / "p", "-q").exit_code == 0
    got = read_dir(str(tmp_path / "p"))
    want = pa.concat_tables([pq.read_table(os.path.join(SAMPLE, "parquet", f))
                             for f in sorted(os.listdir(os.path.join(SAMPLE, "parquet")))])
    assert got.select(want.column_names).equals(want)


ints = st.integers(-2**40, 2**40)
floats = st.floats(width=32, allow_nan=False)
ragged = st.lists(st.lists(ints, max_size=4), max_size=5)
vectors = st.lists(st.lists(floats, min_size=2, max_size=2), max_size=5)
rows = st.lists(st.tuples(st.one_of(st.none(), ints), st.integers(-100, 100), floats,
                          st.one_of(st.none(), st.text(max_size=5)), st.booleans(),
                          st.lists(ints, max_size=6), vectors, ragged), max_size=12)


@given(rows)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_parquet_tfrecord_parquet_preserves_values_and_types(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("rt")
    cols = list(zip(*data)) if data else [[]] * 8
    table = pa.table({
        "maybe": pa.array(cols[0], pa.int64()), "small": pa.array(cols[1], pa.int16()),
        "f": pa.array(cols[2], pa.float32()), "s": pa.array(cols[3], pa.string()),
        "flag": pa.array(cols[4], pa.bool_()), "seq": pa.array(cols[5], pa.list_(pa.int64())),
        "vec": pa.array(cols[6], pa.list_(pa.list_(pa.float32(), 2))),
        "rag": pa.array(cols[7], pa.list_(pa.list_(pa.int64()))),
    })
    os.makedirs(tmp / "src")
    pq.write_table(table, tmp / "src" / "part-0.parquet")
    quiet = RunSettings(threads=2, quiet=True)
    convert(str(tmp / "src"), str(tmp / "tfr"), OutputOptions(format="tfrecord"), run=quiet)
    convert(str(tmp / "tfr"), str(tmp / "back"), OutputOptions(), run=quiet)
    assert read_dir(str(tmp / "back")).equals(table)


# Every type TFRecord output accepts, and how to draw its values (no nulls inside lists: a Feature cannot hold one).
LEAVES = {
    pa.int8(): st.integers(-2**7, 2**7 - 1), pa.int16(): st.integers(-2**15, 2**15 - 1),
    pa.int32(): st.integers(-2**31, 2**31 - 1), pa.int64(): st.integers(-2**63, 2**63 - 1),
    pa.uint8(): st.integers(0, 2**8 - 1), pa.uint16(): st.integers(0, 2**16 - 1),
    pa.uint32(): st.integers(0, 2**32 - 1), pa.uint64(): st.integers(0, 2**63 - 1), pa.bool_(): st.booleans(),
    pa.float16(): st.floats(width=16, allow_nan=False), pa.float32(): st.floats(width=32, allow_nan=False),
    pa.string(): st.text(max_size=4), pa.large_string(): st.text(max_size=4),
    pa.binary(): st.binary(max_size=4), pa.large_binary(): st.binary(max_size=4),
}
SHAPES = {  # name -> (type for a leaf, values for a leaf strategy, usable in an Example)
    "scalar": (lambda t: t, lambda v: v, True),
    "list": (pa.list_, lambda v: st.lists(v, max_size=3), True),
    "large_list": (pa.large_list, lambda v: st.lists(v, max_size=3), True),
    "fixed": (lambda t: pa.list_(t, 2), lambda v: st.lists(v, min_size=2, max_size=2), True),
    "ragged": (lambda t: pa.list_(pa.list_(t)), lambda v: st.lists(st.lists(v, max_size=2), max_size=3), False),
    "steps": (lambda t: pa.list_(pa.list_(t, 2)), lambda v: st.lists(st.lists(v, min_size=2, max_size=2),
                                                                     max_size=3), False),
}


@st.composite
def exact_tables(draw) -> tuple[pa.Table, str]:
    """A table of columns of any type TFRecord output accepts (nullable rows), and a record kind that holds them."""
    kind = draw(st.sampled_from(["sequence_example", "example"]))
    shapes = [s for s, (_, _, in_example) in SHAPES.items() if in_example or kind == "sequence_example"]
    rows = draw(st.integers(0, 6))
    columns = {}
    for i in range(draw(st.integers(1, 4))):
        leaf = draw(st.sampled_from(list(LEAVES)))
        make_type, make_values, _ = SHAPES[draw(st.sampled_from(shapes))]
        values = draw(st.lists(st.one_of(st.none(), make_values(LEAVES[leaf])), min_size=rows, max_size=rows))
        if leaf == pa.float16():
            values = _as_float16(values)
        columns[f"c{i}"] = pa.array(values, make_type(leaf))
    return pa.table(columns), kind


def _as_float16(values):
    """Python floats as NumPy half floats, which is what pyarrow takes for float16."""
    if isinstance(values, list):
        return [_as_float16(v) for v in values]
    return None if values is None else np.float16(values)


@given(exact_tables(), st.sampled_from([None, "gzip"]))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_parquet_tfrecord_parquet_is_exact_for_every_accepted_type(tmp_path_factory, drawn, compression):
    table, kind = drawn
    tmp = tmp_path_factory.mktemp("exact")
    os.makedirs(tmp / "src")
    pq.write_table(table, tmp / "src" / "part-0.parquet")
    quiet = RunSettings(threads=2, quiet=True)
    convert(str(tmp / "src"), str(tmp / "tfr"), OutputOptions(format="tfrecord", writing={"tfrecord_kind": kind},
                                                               compression=compression), run=quiet)
    convert(str(tmp / "tfr"), str(tmp / "back"), OutputOptions(), run=quiet)
    assert read_dir(str(tmp / "back")).equals(pq.read_table(tmp / "src" / "part-0.parquet"))


def test_segment_and_pack_write_plain_examples_when_asked(tmp_path, run_cli):
    """--tfrecord-kind example: the ops' feature lists only shape SequenceExample records; with tf.train.Example
    every segment is one record of flat features, equal to the Parquet output of the same run."""
    src = str(tmp_path / "src.parquet")
    pq.write_table(pq.read_table(os.path.join(SAMPLE, "parquet"), columns=["key", "label", "tokens"]).slice(0, 300), src)
    runs = {"segment": ["--key", "key", "--sequence", "tokens", "--num-unroll", "20", "--batch-size", "8"],
            "pack": ["--max-length", "512", "--sequence", "tokens", "--batch-size", "8"]}
    for command, args in runs.items():
        tables = {}
        for to in ("parquet", "tfrecord"):
            dst = str(tmp_path / f"{command}-{to}")
            result = run_cli(command, src, dst, *args, "--to", to, "--tfrecord-kind", "example", "-q")
            assert result.exit_code == 0, result.stderr
            back = str(tmp_path / f"{command}-{to}-back")
            assert run_cli("convert", dst, back, "--to", "parquet", "-q").exit_code == 0
            tables[to] = read_dir(back)
        assert tables["tfrecord"].column("tokens").to_pylist() == tables["parquet"].column("tokens").to_pylist()
        assert tables["tfrecord"].num_rows == tables["parquet"].num_rows > 0
