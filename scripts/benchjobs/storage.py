"""Padded vs unpadded batch storage (`bucket --padding stored|on-load`): the same bucket run written both ways in
Arrow IPC and zstd Parquet (write seconds, bytes on disk), then a `batchtool.load` epoch of the on-load output
(writable=True and False) against the same epoch of the padded output as its floor: the ratio is what padding on
load costs an epoch. Named `bucket storage ...`, so `--jobs "bucket*"` measures them too.
"""

from __future__ import annotations

from bench import Command, Context, Job
from benchjobs.bucket import BATCH, K, LENGTH, with_dst
from benchjobs.load import FORMATS, kept

STORAGES = ("stored", "on-load")
MEASURED = ("arrow", "parquet zstd")
"""The formats compared: the default (memory-mapped, zero-copy) and the compact one."""


def jobs(ctx: Context) -> list[Job]:
    cli = ("bucket", ctx.parquet, None, "--length", LENGTH, "--auto-buckets", str(K), "--batch-size", str(BATCH),
           "--overwrite", "-q")
    out: list[Job] = []
    for fmt in MEASURED:
        dst = {padding: kept(ctx, f"bucket-storage-{padding}", fmt) for padding in STORAGES}
        out += [Job(f"bucket storage {fmt} {padding}: write", ctx.rows, ctx.parquet_bytes,
                    ours=Command(batchtool=with_dst(cli, dst[padding]) + FORMATS[fmt] + ("--padding", padding)),
                    output=dst[padding],
                    note=f"bucket --auto-buckets {K} --batch-size {BATCH} --padding {padding}, zstd Parquet in, "
                         f"{fmt} out")
                for padding in STORAGES]
        out += [Job(f"bucket storage {fmt} on-load: load epoch writable={writable}", ctx.rows, ctx.parquet_bytes,
                    ours=Command(call="load:epoch", args={"dst": dst["on-load"], "writable": writable}),
                    floor=Command(call="load:epoch", args={"dst": dst["stored"], "writable": writable}),
                    note="one batchtool.load epoch of the on-load output, every column to NumPy and touched; floor = "
                         "the same epoch of the padded (stored) output; ratio = what padding on load costs")
                for writable in (True, False)]
    return out
