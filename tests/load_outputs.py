"""Tiny batch-shard outputs for the loader tests: bucket (independent batches) and segment (lanes), either format."""

from __future__ import annotations

import os

from conftest import write_parquet_shards

from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.bucket import OP, BucketOptions
from batchtool.ops.segment import OP as SEGMENT
from batchtool.ops.segment import SegmentOptions
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table

QUIET = RunSettings(threads=2, quiet=True)
BUCKET_BATCHES = 23
"""Batches of bucket_output: a prime, so no world size in 2..5 divides it."""


def manifest_file(dst: str) -> str:
    """The manifest of an output directory, whatever batchtool names it."""
    return os.path.join(dst, next(f for f in os.listdir(dst) if f.endswith("manifest.json")))


def source(root: str) -> str:
    """240 seeded examples in 2 Parquet shards (made once per root)."""
    src = os.path.join(root, "src")
    if not os.path.exists(src):
        write_parquet_shards(src, make_table(240, seed=4), row_group_size=40)
    return src


def bucket_output(root: str, fmt: str = "parquet", compression: str | None = None, **options) -> str:
    """23 batches of up to 11 rows in 3 files (shards of at most 100 rows), or as many as `options` make."""
    dst = os.path.join(root, f"bucket-{fmt}-{compression}-{sorted(options.items())}")
    if not os.path.exists(dst):
        opts = {"boundaries": (20, 40), "batch_size": (11,), **options}
        run_operation(OP, BucketOptions(**opts), source(root), dst,
                      OutputOptions(format=fmt, compression=compression, shard_rows=100), QUIET, seed=1)
    return dst


def segment_output(root: str, fmt: str = "parquet", world_size: int = 1, compression: str | None = None,
                   allow_small_batch: bool = False) -> str:
    dst = os.path.join(root, f"segment-{fmt}-{world_size}-{compression}-{allow_small_batch}")
    if not os.path.exists(dst):
        options = SegmentOptions(key="key", sequence=("tokens", "frames"), num_unroll=40, batch_size=5,
                                 context=("label",), world_size=world_size, allow_small_batch=allow_small_batch)
        run_operation(SEGMENT, options, source(root), dst,
                      OutputOptions(format=fmt, compression=compression, shard_rows=150), QUIET)
    return dst
