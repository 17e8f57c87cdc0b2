"""Segmentation for truncated BPTT: `segment` (U=20, B=32) vs a pyarrow floor and a tf.data pipeline doing
the same split; then one epoch of `batchtool.load` over the segment output vs that tf.data pipeline.

The segment output is kept in bench_data/<size>/segment-u20-b32 for the load job (run it after the
segment job). The measured functions also print their own batches/s, excluding interpreter and
TensorFlow start-up, since that is what a trainer pays per epoch.
"""

from __future__ import annotations

import glob
import os
import time

from bench import Command, Context, Job

U, B = 20, 32
SEQUENCES, CONTEXT = ("tokens", "frames"), ("label", "weight")


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    kept = os.path.join(ctx.data, f"segment-u{U}-b{B}")
    tf_args = {"src": ctx.tfrecord, "parquet": ctx.parquet, "num_unroll": U, "batch_size": B}
    return [
        Job(f"segment u{U} b{B}", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=("segment", ctx.parquet, kept, "--key", "key", "--sequence", ",".join(SEQUENCES),
                                    "--context", ",".join(CONTEXT), "--num-unroll", str(U), "--batch-size", str(B),
                                    "--overwrite", "-q")),
            floor=Command(call="segment:pyarrow_floor", args={"src": ctx.parquet, "dst": out}),
            peer=Command(call="segment:tfdata_segment", args=tf_args),
            peer_name="tf.data pad to a multiple of U, split, unbatch, batch; TFRecord, AUTOTUNE (writes nothing)",
            note="zstd Parquet in and out, one row group per batch; floor = pyarrow read, copy into preallocated "
                 "padded NumPy arrays, the same columns, zstd write of B consecutive segments per row group"),
        Job(f"segment load epoch (u{U} b{B})", ctx.rows, ctx.parquet_bytes,
            ours=Command(call="segment:load_epoch", args={"dst": kept}),
            peer=Command(call="segment:tfdata_segment", args=tf_args),
            peer_name="the tf.data pipeline of the segment job",
            note="one pass of batchtool.load over the segment output (dicts of NumPy arrays) vs the tf.data "
                 "pipeline; run after the segment job"),
    ]


def pyarrow_floor(src: str, dst: str) -> None:
    """The I/O and copying segment cannot avoid: read each row group, copy every example's steps into
    preallocated [segments, U, ...] arrays padded with zeros, add the same metadata columns
    (vectorised, no lane planning) and write B consecutive segments per zstd row group."""
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
                writer = pq.ParquetWriter(os.path.join(dst, f"part-{i:05d}.parquet"), out.schema, compression="zstd")
            for start in range(0, segments, B):
                writer.write_table(out.slice(start, B), row_group_size=B)
            batches += -(-segments // B)
            examples += len(lengths)
        writer.close()
    print(batches)


def tfdata_segment(src: str, parquet: str, num_unroll: int, batch_size: int) -> None:
    """The peer: tf.data parses the SequenceExamples, pads each to a multiple of U, splits it into
    segments (with sequence index and real length, context repeated), unbatches and batches by B."""
    import tensorflow as tf

    from benchjobs.io import tf_feature_spec

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
    for _ in ds.prefetch(tf.data.AUTOTUNE):
        batches += 1
    seconds = time.perf_counter() - start
    print(f"batches {batches} seconds {seconds:.2f} batches_per_s {batches / seconds:.0f}")


def load_epoch(dst: str) -> None:
    """One epoch of batchtool.load: every batch as a dict of [B, U, ...] NumPy arrays."""
    import batchtool

    if not os.path.exists(os.path.join(dst, ".batchtool_manifest.json")):
        raise SystemExit(f"{dst}: no segment output; run the 'segment u{U} b{B}' job first")
    start = time.perf_counter()
    batches = 0
    for batch in batchtool.load(dst):
        batches += 1
        assert batch["frames"].shape[:2] == (B, U)
    seconds = time.perf_counter() - start
    print(f"batches {batches} seconds {seconds:.2f} batches_per_s {batches / seconds:.0f}")
