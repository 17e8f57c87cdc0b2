"""Reading and writing shards: convert vs a plain pyarrow copy; TFRecord decoding vs tf.data."""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from bench import Command, Context, Job

if TYPE_CHECKING:
    import pyarrow as pa


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    return [
        Job("convert parquet->parquet", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=("convert", ctx.parquet, out, "-q")),
            floor=Command(call="io:pyarrow_copy", args={"src": ctx.parquet, "dst": out}),
            note="zstd Parquet in and out; floor = pyarrow read row group + write, same codec"),
        Job("tfrecord read (SequenceExample)", ctx.rows, ctx.tfrecord_bytes,
            ours=Command(call="io:batchtool_read", args={"src": ctx.tfrecord, "threads": ctx.threads}),
            floor=None,
            peer=Command(call="io:tfdata_parse", args={"src": ctx.tfrecord, "parquet": ctx.parquet}),
            peer_name="tf.data parse_single_sequence_example, AUTOTUNE"),
    ]


def pyarrow_copy(src: str, dst: str, transform: Callable[[pa.Table], pa.Table] | None = None) -> None:
    """The floor: stream every row group through pyarrow into zstd Parquet, and the sha256 of each file written
    (batchtool's manifest records one per shard), nothing else (other floors pass a `transform` of each row group,
    e.g. a filter)."""
    import pyarrow.parquet as pq

    os.makedirs(dst, exist_ok=True)
    for i, path in enumerate(sorted(glob.glob(os.path.join(src, "*.parquet")))):
        pf = pq.ParquetFile(path)
        out = os.path.join(dst, f"part-{i:05d}.parquet")
        with pq.ParquetWriter(out, pf.schema_arrow, compression="zstd") as writer:
            for rg in range(pf.metadata.num_row_groups):
                table = pf.read_row_group(rg)
                writer.write_table(transform(table) if transform else table)
        with open(out, "rb") as written:
            hashlib.file_digest(written, "sha256")


def batchtool_read(src: str, threads: int) -> None:
    """Decode every record of every shard to Arrow (all columns) on `threads` threads."""
    from batchtool.core.runner import Threads
    from batchtool.io.inputs import open_dataset

    rows = sum(chunk.num_rows for chunk in open_dataset(src).chunks(executor=Threads(threads)))
    print(rows)


def tfdata_parse(src: str, parquet: str) -> None:
    """The peer: tf.data reading the same files and parsing every SequenceExample (AUTOTUNE)."""
    import tensorflow as tf

    context, sequence = tf_feature_spec(parquet)
    files = sorted(glob.glob(os.path.join(src, "*.tfrecord*")))
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(lambda x: tf.io.parse_single_sequence_example(x, context, sequence),
                num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    print(sum(1 for _ in ds))


def tf_feature_spec(parquet: str) -> tuple[dict, dict]:
    """(context, sequence) features for tf.io.parse_single_sequence_example, from the Parquet schema."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    schema = pq.ParquetFile(sorted(glob.glob(os.path.join(parquet, "*.parquet")))[0]).schema_arrow
    context, sequence = {}, {}
    for f in schema:
        t = f.type
        if hasattr(t, "value_type"):
            inner = t.value_type
            shape = [inner.list_size] if hasattr(inner, "list_size") else []
            base = inner.value_type if hasattr(inner, "value_type") else inner
            dtype = tf.float32 if "float" in str(base) else tf.int64
            sequence[f.name] = tf.io.FixedLenSequenceFeature(shape, dtype)
        else:
            dtype = tf.string if str(t) == "string" else tf.float32 if "float" in str(t) else tf.int64
            context[f.name] = tf.io.FixedLenFeature([], dtype)
    return context, sequence
