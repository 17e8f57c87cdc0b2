"""Write tests/data/*.tfrecord with TensorFlow itself, plus the values batchtool must decode from them.

Run with an interpreter that has TensorFlow (not a batchtool dependency):
    /path/to/tf-venv/bin/python scripts/make_tf_testdata.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tensorflow as tf

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"

# Rows as batchtool should decode them (None = feature absent). Floats are exact in float32.
SEQUENCE_ROWS: list[dict[str, Any]] = [
    {"id": 7, "name": "alpha", "weights": [0.5, -1.25], "tokens": [3, 1, 4, 1, 5],
     "frames": [[0.0, 1.0, 2.0], [3.5, -4.5, 5.0]], "words": [["a"], ["b", "c"], []]},
    {"id": -9007199254740993, "name": None, "weights": [], "tokens": [],
     "frames": [], "words": [["\u00e9t\u00e9"]]},
    {"id": 9223372036854775807, "name": "\u03b3", "weights": [2.0], "tokens": [-1, 300, 70000],
     "frames": [[1.0, 1.0, 1.0]], "words": None},
]
SEQUENCE_SCHEMA = {"id": "int64", "name": "string", "weights": "list<item: float>",
                   "frames": "list<item: fixed_size_list<item: float>[3]>", "tokens": "list<item: int64>",
                   "words": "list<item: list<item: string>>"}
CONTEXT = ("id", "name", "weights")

EXAMPLE_ROWS: list[dict[str, Any]] = [
    {"label": 1, "score": 0.25, "tags": ["x", "y"], "raw": "00ff10"},
    {"label": 0, "score": -3.0, "tags": [], "raw": None},
    {"label": 2, "score": None, "tags": ["z"], "raw": "80"},
]
EXAMPLE_SCHEMA = {"label": "int64", "raw": "binary", "score": "float", "tags": "list<item: string>"}


def feature(value: Any) -> tf.train.Feature:
    """A Feature of the kind the Python value implies (hex strings in 'raw' are already bytes)."""
    values = value if isinstance(value, list) else [value]
    if all(isinstance(v, int) for v in values) and values:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if all(isinstance(v, (bytes, str)) for v in values) and values:
        return tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[v if isinstance(v, bytes) else v.encode() for v in values]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def empty_feature(column: str) -> tf.train.Feature:
    """An empty value list of the column's kind (the kind is what decides the type)."""
    if column in ("tokens",):
        return tf.train.Feature(int64_list=tf.train.Int64List())
    if column in ("tags", "words"):
        return tf.train.Feature(bytes_list=tf.train.BytesList())
    return tf.train.Feature(float_list=tf.train.FloatList())


def sequence_example(row: dict[str, Any]) -> tf.train.SequenceExample:
    """One SequenceExample: CONTEXT columns are context features, the rest feature lists."""
    example = tf.train.SequenceExample()
    for name, value in row.items():
        if value is None:
            continue
        if name in CONTEXT:
            example.context.feature[name].CopyFrom(feature(value) if value != [] else empty_feature(name))
            continue
        steps = example.feature_lists.feature_list[name].feature
        for step in value:
            steps.add().CopyFrom(feature(step) if step != [] else empty_feature(name))
    return example


def example(row: dict[str, Any]) -> tf.train.Example:
    """One Example; 'raw' holds hex of arbitrary bytes."""
    out = tf.train.Example()
    for name, value in row.items():
        if value is None:
            continue
        if name == "raw":
            value = bytes.fromhex(value)
        out.features.feature[name].CopyFrom(feature(value) if value != [] else empty_feature(name))
    return out


def write(name: str, records: list[bytes], compression: str | None = None) -> None:
    """Write records with tf.io.TFRecordWriter."""
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    with tf.io.TFRecordWriter(str(OUT / name), options) as writer:
        for record in records:
            writer.write(record)


def main() -> None:
    """Write the files and expected.json."""
    OUT.mkdir(parents=True, exist_ok=True)
    sequences = [sequence_example(row).SerializeToString(deterministic=True) for row in SEQUENCE_ROWS]
    examples = [example(row).SerializeToString(deterministic=True) for row in EXAMPLE_ROWS]
    write("tf_sequence_examples.tfrecord", sequences)
    write("tf_sequence_examples.tfrecord.gz", sequences, "GZIP")
    write("tf_examples.tfrecord", examples)
    write("tf_hello.tfrecord", [b"hello", b""])
    expected = {
        "tf_sequence_examples.tfrecord": {"kind": "sequence_example", "schema": SEQUENCE_SCHEMA,
                                          "rows": SEQUENCE_ROWS},
        "tf_sequence_examples.tfrecord.gz": {"kind": "sequence_example", "schema": SEQUENCE_SCHEMA,
                                             "rows": SEQUENCE_ROWS},
        "tf_examples.tfrecord": {"kind": "example", "schema": EXAMPLE_SCHEMA, "rows": EXAMPLE_ROWS,
                                 "hex_columns": ["raw"]},
        "tf_hello.tfrecord": {"payloads_hex": [b"hello".hex(), ""]},
    }
    (OUT / "tf_expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
