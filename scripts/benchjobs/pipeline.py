"""Pipelines: `run` stratify -> bucket vs the pyarrow read+write floor and vs the same stages run one by one;
thread scaling of a CPU-bound pipeline (TFRecord in, bucket, zstd Parquet out) on 1 and 2 threads.

The pipeline files are written beside the corpus (bench_data/<size>/pipelines/), since the work
directory is emptied between measurements.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bench import Command, Context, Job
from benchjobs.io import pyarrow_copy  # noqa: F401  (the floor, called by name)

STRATIFY = {"op": '"stratify"', "target": '"uniform"'}
BUCKET = {"op": '"bucket"', "length": '"tokens"', "auto-buckets": "8", "batch-size": "32"}


def write_pipeline(ctx: Context, name: str, src: str, dst: str, stages: list[dict[str, str]],
                   output: dict[str, str] | None = None) -> str:
    """A pipeline file under bench_data/<size>/pipelines/ (values are TOML literals)."""
    directory = os.path.join(ctx.data, "pipelines")
    os.makedirs(directory, exist_ok=True)
    lines = [f'[input]\npath = "{os.path.abspath(src)}"\n']
    for stage in stages:
        lines.append("[[stage]]\n" + "".join(f"{k} = {v}\n" for k, v in stage.items()))
    lines.append(f'[output]\npath = "{os.path.abspath(dst)}"\noverwrite = true\n'
                 + "".join(f"{k} = {v}\n" for k, v in (output or {}).items()))
    path = os.path.join(directory, f"{name}.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    full = write_pipeline(ctx, "stratify-bucket", ctx.parquet, out, [STRATIFY, BUCKET])
    tfrecord = write_pipeline(ctx, "tfrecord-bucket", ctx.tfrecord, out, [BUCKET], {"compression": '"zstd"'})
    steps = [["stratify", ctx.parquet, os.path.join(ctx.work, "stratified"), "--target", "uniform"],
             ["bucket", os.path.join(ctx.work, "stratified"), out, "--length", "tokens", "--auto-buckets", "8",
              "--batch-size", "32"]]
    return [
        Job("pipeline stratify->bucket", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=("run", full, "-q")),
            floor=Command(call="io:pyarrow_copy", args={"src": ctx.parquet, "dst": out}),
            peer=Command(call="pipeline:one_by_one", args={"steps": steps}),
            peer_name="the same stages as two commands",
            note="zstd Parquet in and out; stratify uniform (exact) -> bucket auto-8 b32; floor = pyarrow read + "
                 "zstd write of the whole input; peer = `stratify` then `bucket` (sum of the parts)"),
        Job("pipeline tfrecord->bucket->zstd: 2 threads vs 1", ctx.rows, ctx.tfrecord_bytes,
            ours=Command(batchtool=("run", tfrecord, "-q", "--threads", "2")),
            floor=Command(batchtool=("run", tfrecord, "-q", "--threads", "1")),
            note="CPU-bound: TFRecord decode, bucket auto-8 b32, zstd Parquet out; 'floor' here is the same run "
                 "on 1 thread, so 1 / ratio is the speed-up of --threads 2"),
    ]


def one_by_one(steps: list[list[str]]) -> None:
    """Each stage as its own command, each reading the previous one's output."""
    for args in steps:
        subprocess.run([sys.executable, "-m", "batchtool", *args, "-q"], check=True)
