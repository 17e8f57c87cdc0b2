"""Generate a realistic, seeded sequence corpus (the committed sample_data/ and the benchmark data).

Imbalanced integer labels, long-tailed (lognormal, clipped) lengths, an int `tokens`
sequence, per-step float `frames` vectors, a float `weight` and a unique string `key`.

    python scripts/make_sample_data.py                       # rewrites sample_data/
    python scripts/make_sample_data.py --rows 200000 --median-length 100 --max-length 2000 \\
        --frame-dim 16 --shards 8 --out /tmp/corpus           # benchmark scale
"""

from __future__ import annotations

import argparse
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from batchtool.io.formats.example import encode_records
from batchtool.core.synthetic import make_table
from batchtool.io.formats.tfrecord.writer import TFRecordFileWriter

def write_corpus(out: str, rows: int, shards: int, seed: int, tfrecord: bool, parquet: bool,
                 chunk_rows: int = 20000, tfrecord_compression: str | None = "GZIP", **shape: float) -> None:
    """Write Parquet shards under out/parquet and TFRecord SequenceExample shards under out/tfrecord."""
    per_shard = -(-rows // shards)
    for fmt, enabled in (("parquet", parquet), ("tfrecord", tfrecord)):
        if enabled:
            shutil.rmtree(os.path.join(out, fmt), ignore_errors=True)
            os.makedirs(os.path.join(out, fmt))
    for shard in range(shards):
        start, stop = shard * per_shard, min(rows, (shard + 1) * per_shard)
        pw = pq.ParquetWriter(os.path.join(out, "parquet", f"part-{shard:05d}.parquet"),
                              make_table(0, seed, **shape).schema, compression="zstd") if parquet else None
        suffix = ".tfrecord.gz" if tfrecord_compression else ".tfrecord"
        tw = TFRecordFileWriter(os.path.join(out, "tfrecord", f"part-{shard:05d}{suffix}"),
                                compression=tfrecord_compression) if tfrecord else None
        for first in range(start, stop, chunk_rows):
            table = make_table(min(chunk_rows, stop - first), seed, first, **shape)
            if pw:
                pw.write_table(table, row_group_size=max(1, min(chunk_rows, 5000)))
            if tw:
                for batch in table.to_batches():
                    tw.write_many(encode_records(batch, "sequence_example"))
        if pw:
            pw.close()
        if tw:
            tw.close()


def write_flagged(out: str, seed: int, rows: int = 40) -> None:
    """out/flagged.parquet: a few rows of the corpus with a boolean `keep` column (true for every class but 0,
    null for every seventh row), for the `filter` examples."""
    table = make_table(rows, seed)
    keep = [None if i % 7 == 6 else label != 0 for i, label in enumerate(table.column("label").to_pylist())]
    pq.write_table(table.append_column("keep", pa.array(keep, pa.bool_())), os.path.join(out, "flagged.parquet"),
                   compression="zstd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "sample_data"))
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--median-length", type=float, default=30.0)
    parser.add_argument("--max-length", type=int, default=400)
    parser.add_argument("--frame-dim", type=int, default=3)
    parser.add_argument("--no-tfrecord", action="store_true")
    parser.add_argument("--no-parquet", action="store_true")
    args = parser.parse_args()
    write_corpus(args.out, args.rows, args.shards, args.seed, tfrecord=not args.no_tfrecord,
                 parquet=not args.no_parquet, median_length=args.median_length, max_length=args.max_length,
                 frame_dim=args.frame_dim)
    if not args.no_parquet:
        write_flagged(args.out, args.seed)


if __name__ == "__main__":
    main()
