"""`bucket`: group examples by length (or a bucket column) into padded batches, in bounded memory: its options
and its declaration (ops.bucket.op runs it; the plan is in ops.bucket.plan, the batches in ops.bucket.batches, what it reports in
ops.bucket.report)."""

from __future__ import annotations

from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Kind, OutputRows
from batchtool.ops.bucket.options import BucketOptions

DECLARED = Declaration(
    "bucket",
    summary=("Group examples by length into padded batches (tf.contrib.training.bucket / bucket_by_sequence_length)."
             "\n\nEvery batch holds examples of one bucket, padded to one length; batches from all buckets are "
             "written in a seeded random order. DST gets batch, bucket and length columns, and a manifest with "
             "padding efficiency per bucket."),
    example="batchtool bucket sample_data/parquet /tmp/bucketed --length tokens --auto-buckets 8 --batch-size 32",
    options=BucketOptions,
    kind=Kind.BATCHES,
    seeded=True,
    spills=("memory",),
    output_rows=OutputRows.PADDED)


__getattr__ = exports(globals(), {name: ("batchtool.ops.bucket.op", name) for name in ("OP", "Bucket")})

__all__ = ["DECLARED", "OP", "Bucket", "BucketOptions"]
