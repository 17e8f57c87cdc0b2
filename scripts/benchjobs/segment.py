"""Segmentation for truncated BPTT: `segment` (U=20, B=32) vs a pyarrow floor and a tf.data pipeline doing
the same split, in every batch format, --threads 2 vs 1; then one epoch of `batchtool.load` per format vs
that tf.data pipeline.

The segment output of every format is kept in bench_data/<size>/segment-u20-b32-<format> for the load
epoch jobs, which follow the segment jobs. The tf.data peer prints its own seconds, excluding interpreter
and TensorFlow start-up, since that is what a trainer pays per epoch.
"""

from __future__ import annotations

import glob
import os
import time

from bench import Command, Context, Job
from benchjobs.bucket import with_dst
from benchjobs.load import FORMATS, epoch_jobs, kept

U, B = 20, 32
SEQUENCES, CONTEXT = ("tokens", "frames"), ("label", "weight")


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    base = f"segment-u{U}-b{B}"
    cli = ("segment", ctx.parquet, None, "--key", "key", "--sequence", ",".join(SEQUENCES), "--context",
           ",".join(CONTEXT), "--num-unroll", str(U), "--batch-size", str(B), "--overwrite", "-q")
    peer = Command(call="segment:tfdata_segment",
                   args={"src": ctx.tfrecord, "parquet": ctx.parquet, "num_unroll": U, "batch_size": B})
    peer_name = "tf.data pad to a multiple of U, split, unbatch, batch; TFRecord, AUTOTUNE (writes nothing)"
    floors = {fmt: Command(call="segment:pyarrow_floor", args={"src": ctx.parquet, "dst": out, "fmt": fmt})
              for fmt in ("arrow", "parquet zstd")}
    write = [
        Job(f"segment u{U} b{B} {fmt}", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=with_dst(cli, kept(ctx, base, fmt)) + options),
            floor=floors.get(fmt), peer=peer, peer_name=peer_name, output=kept(ctx, base, fmt),
            note=f"zstd Parquet in, {fmt} out (Arrow IPC: a record batch per work item of 64 batches; Parquet: a row "
                 "group per batch); floor = pyarrow read, copy "
                 "into preallocated padded NumPy arrays, the same columns, B consecutive segments per batch in "
                 "the same format; peer seconds inside its process (TensorFlow start-up excluded), every batch "
                 "to NumPy and touched")
        for fmt, options in FORMATS.items()
    ]
    threads = Job(f"segment u{U} b{B} arrow: threads 2 vs 1", ctx.rows, ctx.parquet_bytes,
                  ours=Command(batchtool=with_dst(cli, out) + FORMATS["arrow"] + ("--threads", "2")),
                  floor=Command(batchtool=with_dst(cli, out) + FORMATS["arrow"] + ("--threads", "1")),
                  note="ours = --threads 2, floor = --threads 1: the ratio is the time --threads 2 takes "
                       "(target <= 0.63, i.e. >= 1.6x faster)")
    return [*write, threads, *epoch_jobs(ctx, base, f"segment u{U} b{B}", peer,
                                         "the tf.data pipeline of the segment job")]


def pyarrow_floor(src: str, dst: str, fmt: str = "parquet zstd") -> None:
    """The I/O and copying segment cannot avoid: read each row group, copy every example's steps into
    preallocated [segments, U, ...] arrays padded with zeros, add the same metadata columns
    (vectorised, no lane planning) and write B consecutive segments per zstd row group, or per
    uncompressed Arrow IPC record batch (fmt 'arrow')."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    os.makedirs(dst, exist_ok=True)
    batches = examples = 0
    for i, path in enumerate(sorted(glob.glob(os.path.join(src, "*.parquet")))):
        pf = pq.ParquetFile(path)
        writer = None
        for rg in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(rg, columns=["key", *CONTEXT, *SEQUENCES]).combine_chunks()
            lengths = pc.list_value_length(table.column("tokens")).to_numpy().astype(np.int64)
            count = np.maximum(1, -(-lengths // U))
            first = np.cumsum(count) - count
            segments = int(count.sum())
            dest = np.repeat(first * U, lengths) + np.arange(int(lengths.sum())) - np.repeat(
                np.cumsum(lengths) - lengths, lengths)
            example = np.repeat(np.arange(len(lengths)), count)
            seq = np.arange(segments) - first[example]
            columns: dict[str, pa.Array] = {}
            keys = table.column("key").combine_chunks().take(pa.array(example))

            def number(values: np.ndarray) -> pa.Array:
                return pc.utf8_lpad(pc.cast(pa.array(values), pa.string()), 5, "0")

            columns["key"] = pc.binary_join_element_wise(number(seq), "_of_", number(count[example]), ":", keys, "")
            columns["next_key"] = pc.if_else(
                pa.array(seq + 1 >= count[example]), pc.binary_join_element_wise("STOP:", keys, ""),
                pc.binary_join_element_wise(number(seq + 1), "_of_", number(count[example]), ":", keys, ""))
            columns["sequence"] = pa.array(seq.astype(np.int32))
            columns["sequence_count"] = pa.array(count[example].astype(np.int32))
            columns["length"] = pa.array(np.clip(lengths[example] - seq * U, 0, U).astype(np.int32))
            columns["total_length"] = pa.array(lengths[example].astype(np.int32))
            columns["insertion_index"] = pa.array(-(1 << 63) + examples + example)
            columns["lane"] = pa.array((np.arange(segments) % B).astype(np.int32))
            columns["batch"] = pa.array(batches + np.arange(segments) // B)
            for name in CONTEXT:
                columns[name] = table.column(name).combine_chunks().take(pa.array(example))
            for name in SEQUENCES:
                arr = table.column(name).combine_chunks()
                values = arr.flatten()
                inner = values.type.list_size if pa.types.is_fixed_size_list(values.type) else 1
                flat = (values.flatten() if inner > 1 else values).to_numpy().reshape(-1, inner)
                padded = np.zeros((segments * U, inner), dtype=flat.dtype)
                padded[dest] = flat
                leaf = pa.array(padded.ravel())
                steps = pa.FixedSizeListArray.from_arrays(leaf, inner) if inner > 1 else leaf
                columns[name] = pa.ListArray.from_arrays(pa.array(np.arange(segments + 1, dtype=np.int32) * U), steps)
            out = pa.table(columns)
            if writer is None:
                writer = (pa.ipc.new_file(os.path.join(dst, f"part-{i:05d}.arrow"), out.schema) if fmt == "arrow"
                          else pq.ParquetWriter(os.path.join(dst, f"part-{i:05d}.parquet"), out.schema,
                                                compression="zstd"))
            for start in range(0, segments, B):
                if fmt == "arrow":
                    writer.write_table(out.slice(start, B))
                else:
                    writer.write_table(out.slice(start, B), row_group_size=B)
            batches += -(-segments // B)
            examples += len(lengths)
        writer.close()
    print(batches)


def tfdata_segment(src: str, parquet: str, num_unroll: int, batch_size: int) -> None:
    """The peer: tf.data parses the SequenceExamples, pads each to a multiple of U, splits it into
    segments (with sequence index and real length, context repeated), unbatches and batches by B; every
    batch to NumPy and touched as load:epoch does."""
    import tensorflow as tf

    from benchjobs.io import tf_feature_spec
    from benchjobs.load import touch

    context, sequence = tf_feature_spec(parquet)

    def split(record: tf.Tensor) -> dict:
        ctx, seq = tf.io.parse_single_sequence_example(record, context, sequence)
        n = tf.shape(seq["tokens"])[0]
        count = tf.maximum(1, (n + num_unroll - 1) // num_unroll)
        out = {}
        for name, value in seq.items():
            pad = tf.concat([[[0, count * num_unroll - n]], tf.zeros([tf.rank(value) - 1, 2], tf.int32)], 0)
            out[name] = tf.reshape(tf.pad(value, pad), tf.concat([[count, num_unroll], tf.shape(value)[1:]], 0))
        index = tf.range(count)
        out["sequence"] = index
        out["length"] = tf.clip_by_value(n - index * num_unroll, 0, num_unroll)
        for name, value in ctx.items():
            out[name] = tf.fill([count], value)
        return out

    files = sorted(glob.glob(os.path.join(src, "*.tfrecord*")))
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(split, num_parallel_calls=tf.data.AUTOTUNE).unbatch().batch(batch_size)
    start = time.perf_counter()
    batches = 0
    for batch in ds.prefetch(tf.data.AUTOTUNE):
        touch({name: value.numpy() for name, value in batch.items()})
        batches += 1
    seconds = time.perf_counter() - start
    print(f"batches {batches} seconds {seconds:.2f} batches_per_s {batches / seconds:.0f}")

