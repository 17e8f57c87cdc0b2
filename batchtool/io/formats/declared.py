"""What each shard format says of itself (names, file endings, codecs, write options) and the output's casts, importing
no codec (neither NumPy nor pyarrow): what --help and the option schemas read; each Format class takes its own."""

from __future__ import annotations

from dataclasses import dataclass

from batchtool.core.options import Choice, option

TFRECORD_KINDS = ("sequence_example", "example")
"""What a TFRecord file's records hold: tf.train.SequenceExample (what batchtool writes unless asked) or
tf.train.Example."""


@dataclass(frozen=True)
class Declared:
    """One format's declaration: the Reader and Writer attributes of the same names (io/formats/base.py says what
    each means) come from it, so --help and messages read them without importing the format's module."""

    name: str
    label: str
    suffixes: tuple[str, ...]
    writes: bool = True
    """A Format (--to may name it); False: a Reader only."""
    codecs: tuple[str, ...] = ()
    default_codec: str | None = None
    record_checksums: bool = False
    float32_only: str | None = None
    write_options: type | None = None


@dataclass(frozen=True)
class TFRecordWriting:
    """How TFRecord shards are written (TFRecordFormat.write_options)."""

    tfrecord_kind: str = option("Payload of TFRecord output.", Choice(TFRECORD_KINDS), TFRECORD_KINDS[0])


DECLARED = {d.name: d for d in (
    Declared("parquet", "Parquet", (".parquet", ".pq"), codecs=("zstd", "snappy", "gzip", "lz4", "brotli", "none"),
             default_codec="zstd"),
    Declared("tfrecord", "TFRecord",
             (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrecord.gzip"),
             codecs=("gzip", "none"), default_codec="none", record_checksums=True,
             float32_only="tf.train.FloatList holds float32", write_options=TFRecordWriting),
    Declared("arrow", "Arrow IPC", (".arrow", ".ipc", ".arrows"), codecs=("none", "lz4", "zstd"), default_codec="none"),
)}
"""The built-in formats' declarations, by name (a format registered in io.formats.registry.FORMATS with none is
imported when --help or a message asks what it is)."""

RECORDED_OPTIONS = ("tfrecord_kind",)
"""The reading options a manifest records of every input and output, each None where the format has no such option,
so that every manifest has one shape whatever its formats (a format's option is named here only if readers of
its manifests need it)."""


CASTS = {"float64=float32": ("float64", "float32")}
"""Lossy conversions the output of a format holding floats as float32 only makes only when asked (--cast): the Arrow
types' names (pyarrow.type_for_alias), from and to."""
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
"""Where an output shard ends without --shard-bytes."""
