"""Length bucketing: `bucket` in every batch format vs a pyarrow floor (read, pad, write) and tf.data
bucket_by_sequence_length, --threads 2 vs 1; then one epoch of `batchtool.load` per format vs the same
tf.data pipeline.

Boundaries (auto-chosen and 8 equal-count quantiles) are computed once from the corpus's length
histogram and cached in bench_data/<size>/bucket_boundaries.json, so the floor and tf.data get
exactly the boundaries `bucket --auto-buckets 8` chooses. The bucketed output of every format is
kept in bench_data/<size>/bucket-auto8-<format> for the load epoch jobs, which follow the bucket jobs.
"""

from __future__ import annotations

import glob
import json
import os
import time

from bench import Command, Context, Job
from benchjobs.load import FORMATS, epoch_jobs, kept

K, BATCH = 8, 32
LENGTH = "tokens"


def boundaries(ctx: Context) -> dict[str, list[int]]:
    """{'auto': what --auto-buckets 8 chooses, 'quantile': 8 equal-count buckets}, cached beside the data."""
    path = os.path.join(ctx.data, "bucket_boundaries.json")
    if not os.path.exists(path):
        import numpy as np
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from batchtool.ops.boundaries import choose_boundaries, quantile_boundaries

        counts = np.zeros(0, dtype=np.int64)
        for f in sorted(glob.glob(os.path.join(ctx.parquet, "*.parquet"))):
            lengths = pc.list_value_length(pq.read_table(f, columns=[LENGTH]).column(LENGTH)).to_numpy()
            more = np.bincount(lengths)
            counts = np.pad(counts, (0, max(0, len(more) - len(counts))))
            counts[: len(more)] += more
        cached = {"auto": list(choose_boundaries(counts, K)), "quantile": list(quantile_boundaries(counts, K))}
        with open(path, "w") as f:
            json.dump(cached, f)
    with open(path) as f:
        return json.load(f)


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    b = boundaries(ctx)
    cli = ("bucket", ctx.parquet, None, "--length", LENGTH, "--auto-buckets", str(K), "--batch-size", str(BATCH),
           "--overwrite", "-q")
    peer = Command(call="bucket:tfdata_bucket",
                   args={"src": ctx.tfrecord, "parquet": ctx.parquet, "boundaries": b["auto"], "batch_size": BATCH})
    peer_name = "tf.data bucket_by_sequence_length, TFRecord, AUTOTUNE (writes nothing)"
    floors = {fmt: Command(call="bucket:pyarrow_floor", args={"src": ctx.parquet, "dst": out, "boundaries": b["auto"],
                                                              "batch_size": BATCH, "fmt": fmt})
              for fmt in ("arrow", "parquet zstd")}
    write = [
        Job(f"bucket auto-{K} b{BATCH} {fmt}", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=with_dst(cli, kept(ctx, "bucket-auto8", fmt)) + options),
            floor=floors.get(fmt), peer=peer, peer_name=peer_name, output=kept(ctx, "bucket-auto8", fmt),
            note=f"zstd Parquet in, {fmt} out, boundaries {b['auto']}; floor = pyarrow read, per-bucket batches "
                 "of consecutive rows padded with padding.pad_batch, the same format written (no shuffle, no spill); "
                 "peer seconds inside its process (TensorFlow start-up excluded), every batch to NumPy and touched")
        for fmt, options in FORMATS.items()
    ]
    threads = Job(f"bucket auto-{K} b{BATCH} arrow: threads 2 vs 1", ctx.rows, ctx.parquet_bytes,
                  ours=Command(batchtool=with_dst(cli, out) + FORMATS["arrow"] + ("--threads", "2")),
                  floor=Command(batchtool=with_dst(cli, out) + FORMATS["arrow"] + ("--threads", "1")),
                  note="ours = --threads 2, floor = --threads 1: the ratio is the time --threads 2 takes "
                       "(target <= 0.63, i.e. >= 1.6x faster)")
    return [*write, threads, *epoch_jobs(ctx, "bucket-auto8", f"bucket b{BATCH}", peer,
                                         "the tf.data pipeline of the bucket job")]


def with_dst(cli: tuple, dst: str) -> tuple[str, ...]:
    """The command line `cli` with its DST (the None) filled in."""
    return tuple(dst if arg is None else arg for arg in cli)


def pyarrow_floor(src: str, dst: str, boundaries: list[int], batch_size: int, fmt: str = "parquet zstd") -> None:
    """Read every row group, cut each bucket's rows into batches of consecutive rows as they arrive,
    pad them and write one batch per zstd row group, or per uncompressed Arrow IPC record batch (fmt
    'arrow'): the I/O and padding bucket cannot avoid."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchtool.io.padding import pad_batch, row_lengths

    files = sorted(glob.glob(os.path.join(src, "*.parquet")))
    schema = pq.ParquetFile(files[0]).schema_arrow
    sequences = [f.name for f in schema if pa.types.is_list(f.type)]
    pending: dict[int, list[pa.RecordBatch]] = {}
    os.makedirs(dst, exist_ok=True)
    writer = None
    batches = 0

    def emit(rows: pa.RecordBatch, bucket: int) -> None:
        nonlocal writer, batches
        lengths = row_lengths(rows.column(LENGTH))
        out = pad_batch(rows, sequences, int(lengths.max(initial=0)), {})
        n = rows.num_rows
        out = (out.append_column("batch", pa.array(np.full(n, batches, dtype=np.int64)))
               .append_column("bucket", pa.array(np.full(n, bucket, dtype=np.int32)))
               .append_column("length", pa.array(lengths.astype(np.int32))))
        if writer is None:
            writer = (pa.ipc.new_file(os.path.join(dst, "part-00000.arrow"), out.schema) if fmt == "arrow" else
                      pq.ParquetWriter(os.path.join(dst, "part-00000.parquet"), out.schema, compression="zstd"))
        writer.write_batch(out)
        batches += 1

    for path in files:
        pf = pq.ParquetFile(path)
        for rg in range(pf.metadata.num_row_groups):
            batch = pa.Table.from_batches(pf.read_row_group(rg).combine_chunks().to_batches()).to_batches()[0]
            buckets = np.searchsorted(boundaries, row_lengths(batch.column(LENGTH)), side="right")
            for b in np.unique(buckets).tolist():
                queue = pending.setdefault(b, [])
                queue.append(batch.filter(pa.array(buckets == b)))
                held = pa.Table.from_batches(queue).combine_chunks()
                full = held.num_rows // batch_size * batch_size
                for start in range(0, full, batch_size):
                    emit(held.slice(start, batch_size).to_batches()[0], b)
                rest = held.slice(full)
                pending[b] = rest.to_batches() if rest.num_rows else []
    for b, queue in sorted(pending.items()):
        if queue:
            emit(pa.Table.from_batches(queue).combine_chunks().to_batches()[0], b)
    writer.close()
    print(batches)


def tfdata_bucket(src: str, parquet: str, boundaries: list[int], batch_size: int) -> None:
    """The peer: tf.data parses the SequenceExamples and buckets them with bucket_by_sequence_length
    (dynamic padding, same boundaries and batch size), every batch to NumPy and touched as load_epoch
    does; prints batches, padding efficiency and the seconds of the epoch (TensorFlow start-up excluded)."""
    import tensorflow as tf

    from benchjobs.io import tf_feature_spec
    from benchjobs.load import touch

    context, sequence = tf_feature_spec(parquet)

    def parse(record: tf.Tensor) -> dict:
        ctx, seq = tf.io.parse_single_sequence_example(record, context, sequence)
        return {**ctx, **seq, "length": tf.shape(seq[LENGTH])[0]}

    files = sorted(glob.glob(os.path.join(src, "*.tfrecord*")))
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.bucket_by_sequence_length(lambda x: x["length"], bucket_boundaries=boundaries,
                                      bucket_batch_sizes=[batch_size] * (len(boundaries) + 1))
    start = time.perf_counter()
    batches = real = padded = 0
    for batch in ds.prefetch(tf.data.AUTOTUNE):
        arrays = {name: value.numpy() for name, value in batch.items()}
        touch(arrays)
        rows, width = arrays[LENGTH].shape[:2]
        batches += 1
        real += int(arrays["length"].sum())
        padded += rows * width
    seconds = time.perf_counter() - start
    print(f"batches {batches} padding_efficiency {real / padded:.4f} seconds {seconds:.3f}")


def pad_throughput(src: str, batch_size: int = BATCH, limit: int = 20_000, repeats: int = 3) -> None:
    """Padding alone, per GB: the first `limit` rows of SRC (zstd Parquet) sorted by length, cut into batches of
    `batch_size`, every list column padded to its batch's longest row (padding.pad_batch, what bucket does per
    batch) in memory; prints the padded GB and the best of `repeats` passes' CPU seconds per GB of padded output
    (the docs/internals.md figure):

        python scripts/bench.py --call bucket:pad_throughput '{"src": "bench_data/200MB/parquet"}'
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from batchtool.io.padding import pad_batch, row_lengths

    table = pq.read_table(sorted(glob.glob(os.path.join(src, "*.parquet")))[0]).slice(0, limit).combine_chunks()
    table = table.take(pc.sort_indices(pc.list_value_length(table.column(LENGTH))))
    rows = table.to_batches()[0]
    sequences = [f.name for f in table.schema if pa.types.is_list(f.type)]
    batches = [rows.slice(start, batch_size) for start in range(0, table.num_rows, batch_size)]
    lengths = [int(row_lengths(b.column(LENGTH)).max(initial=0)) for b in batches]
    padded = sum(pad_batch(b, sequences, n, {}).nbytes for b, n in zip(batches, lengths))
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for batch, n in zip(batches, lengths):
            pad_batch(batch, sequences, n, {})
        best = min(best, time.process_time() - start)
    print(f"batches {len(batches)} padded_gb {padded / 1e9:.3f} cpu_s_per_gb {best / (padded / 1e9):.3f}")
