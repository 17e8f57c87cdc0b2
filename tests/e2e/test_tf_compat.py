"""Compatibility with TensorFlow: files TF wrote (tests/data) and, where TF is installed, TF reading ours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from batchtool.io.formats.example import SequenceExample, decode_records, encode_records, infer_schema
from batchtool.io.formats.tfrecord.framing import frame_records
from batchtool.io.formats.tfrecord.records import iter_records
from batchtool.io.formats.tfrecord.stream import detect_compression
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter

DATA = Path(__file__).parents[1] / "data"
EXPECTED = json.loads((DATA / "tf_expected.json").read_text())
TF_FILES = [name for name in sorted(EXPECTED) if "rows" in EXPECTED[name]]


def expected_rows(name: str) -> list[dict[str, Any]]:
    spec = EXPECTED[name]
    return [{k: bytes.fromhex(v) if k in spec.get("hex_columns", ()) and v is not None else v
             for k, v in row.items()} for row in spec["rows"]]


@pytest.mark.parametrize("name", TF_FILES)
def test_files_written_by_tensorflow_decode_exactly(name: str) -> None:
    path = str(DATA / name)
    payloads = list(iter_records(path))
    schema, kind = infer_schema(payloads, path=path)
    assert kind == EXPECTED[name]["kind"]
    assert {f.name: str(f.type) for f in schema} == EXPECTED[name]["schema"]
    batch = decode_records(payloads, schema, kind, path=path, first_record=0)
    assert batch.to_pylist() == expected_rows(name)


@pytest.mark.parametrize("name", TF_FILES)
def test_reencoding_gives_tensorflows_bytes(name: str) -> None:
    path = str(DATA / name)
    payloads = list(iter_records(path))
    schema, kind = infer_schema(payloads, path=path)
    batch = decode_records(payloads, schema, kind, path=path, first_record=0)
    lists = None
    if kind == "sequence_example":
        lists = set().union(*(SequenceExample.FromString(p).feature_lists.feature_list.keys() for p in payloads))
    assert encode_records(batch, kind, sequence_columns=lists) == payloads


def test_framing_is_byte_identical_to_tensorflows() -> None:
    for name in ("tf_sequence_examples.tfrecord", "tf_examples.tfrecord", "tf_hello.tfrecord"):
        data = (DATA / name).read_bytes()
        assert frame_records(iter_records(str(DATA / name))) == data
    assert list(iter_records(str(DATA / "tf_hello.tfrecord"))) == [
        bytes.fromhex(h) for h in EXPECTED["tf_hello.tfrecord"]["payloads_hex"]]
    assert detect_compression(str(DATA / "tf_sequence_examples.tfrecord.gz")) == "GZIP"
    assert detect_compression(str(DATA / "tf_sequence_examples.tfrecord")) is None


def sample_batch() -> pa.RecordBatch:
    return pa.record_batch({
        "id": pa.array([1, 2, -3]),
        "name": pa.array(["a", None, "ç"]),
        "weights": pa.array([[0.5], [], [1.0, 2.0]], pa.list_(pa.float32())),
        "tokens": pa.array([[1, 2, 3], [], [1 << 40]]),
        "frames": pa.array([[[0.0, 1.0, 2.0]], [], [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]],
                           pa.list_(pa.list_(pa.float32(), 3))),
        "words": pa.array([[["x", "y"], []], [["z"]], []], pa.list_(pa.list_(pa.string()))),
    })


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_tensorflow_reads_batchtool_output(tmp_path: Path, compression: str | None) -> None:
    tf = pytest.importorskip("tensorflow")
    batch = sample_batch()
    path = tmp_path / "out.tfrecord"
    with TFRecordFileWriter(str(path), compression=compression) as writer:
        writer.write_many(encode_records(batch, sequence_columns=["tokens", "frames", "words"]))
    context = {"id": tf.io.FixedLenFeature([], tf.int64),
               "name": tf.io.FixedLenFeature([], tf.string, default_value=b"<missing>"),
               "weights": tf.io.VarLenFeature(tf.float32)}
    sequence = {"tokens": tf.io.FixedLenSequenceFeature([], tf.int64),
                "frames": tf.io.FixedLenSequenceFeature([3], tf.float32),
                "words": tf.io.RaggedFeature(tf.string)}
    dataset = tf.data.TFRecordDataset(str(path), compression_type=compression or "")
    rows = batch.to_pylist()
    parsed = [tf.io.parse_single_sequence_example(record, context, sequence) for record in dataset]
    assert len(parsed) == len(rows)
    for (ctx, seq), row in zip(parsed, rows):
        assert int(ctx["id"]) == row["id"]
        assert ctx["name"].numpy().decode() == (row["name"] if row["name"] is not None else "<missing>")
        assert tf.sparse.to_dense(ctx["weights"]).numpy().tolist() == row["weights"]
        assert seq["tokens"].numpy().tolist() == row["tokens"]
        assert seq["frames"].numpy().reshape(-1, 3).tolist() == row["frames"]
        assert [[w.decode() for w in step] for step in seq["words"].to_list()] == row["words"]


def test_tensorflow_reads_batchtool_examples(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    batch = pa.record_batch({"label": pa.array([3, 4]), "score": pa.array([0.25, 1.5], pa.float64()),
                             "tags": pa.array([["a"], ["b", "c"]]), "raw": pa.array([b"\x00\xff", b""])})
    path = tmp_path / "ex.tfrecord"
    with TFRecordFileWriter(str(path)) as writer:
        writer.write_many(encode_records(batch, "example"))
    spec = {"label": tf.io.FixedLenFeature([], tf.int64), "score": tf.io.FixedLenFeature([], tf.float32),
            "tags": tf.io.VarLenFeature(tf.string), "raw": tf.io.FixedLenFeature([], tf.string)}
    parsed = [tf.io.parse_single_example(record, spec) for record in tf.data.TFRecordDataset(str(path))]
    for features, row in zip(parsed, batch.to_pylist(), strict=True):
        assert int(features["label"]) == row["label"]
        assert float(features["score"]) == float(np.float32(row["score"]))
        assert [t.decode() for t in features["tags"].values.numpy()] == row["tags"]
        assert features["raw"].numpy() == row["raw"]


def test_the_documented_tf_data_snippet_gives_the_loaders_batches(tmp_path: Path, run_cli) -> None:
    """docs/load.md's snippet, run as written on bucket output with partial batches, where `.batch(B)` is wrong."""
    tf = pytest.importorskip("tensorflow")
    import batchtool

    dst = str(tmp_path / "out")
    done = run_cli("bucket", str(Path(__file__).parents[2] / "sample_data" / "parquet"), dst, "--boundaries",
                   "20,40,80", "--batch-size", "32", "--to", "tfrecord", "--shard-rows", "1000", "--quiet")
    assert done.exit_code == 0, done.output
    manual = (Path(__file__).parents[2] / "docs" / "load.md").read_text()
    section = manual.split("## TensorFlow: the same batches with `tf.data`")[1].split("\n## ")[0]
    snippet = section.split("```python\n")[1].split("```")[0]
    scope: dict[str, Any] = {"dst": dst}
    exec(snippet, scope)  # noqa: S102  (the documentation's code, checked as a user would run it)

    theirs = list(scope["batches"].as_numpy_iterator())
    ours = list(batchtool.load(dst, shuffle=False))
    naive = tf.data.TFRecordDataset(sorted(map(str, Path(dst).glob("*.tfrecord")))).batch(32)
    assert {len(b["label"]) for b in ours} != {32}
    assert sum(1 for _ in naive) != len(ours)
    assert len(theirs) == len(ours) == 127
    for tf_batch, batch in zip(theirs, ours):
        for column in ("batch", "label", "length", "frames"):
            assert tf_batch[column].shape == batch[column].shape
            assert (tf_batch[column] == batch[column]).all(), column
