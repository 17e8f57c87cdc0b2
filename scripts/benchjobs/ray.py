"""--engine ray vs --engine local on the same machine: convert, stratify and bucket, each run in the same
Python (one that can import ray), so the ratio is the Ray engine's overhead alone.

The Ray engine starts a local cluster with --threads CPUs (all cores here), runs every per-item
function as a Ray task and writes on the driver. Jobs are listed only when a Python that imports
ray is found: this one, or $BATCHTOOL_RAY_PYTHON (e.g. a venv holding `pip install 'batchtool[ray]'`).
Peak RSS is the driver's; the Ray workers' memory is not included.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bench import Command, Context, Job
from benchjobs.bucket import BATCH, K, LENGTH


def ray_python() -> str | None:
    """A Python that can import ray (and batchtool's dependencies), or None."""
    for python in filter(None, [sys.executable, os.environ.get("BATCHTOOL_RAY_PYTHON")]):
        if subprocess.run([python, "-c", "import ray, pyarrow, click"], capture_output=True).returncode == 0:
            return python
    return None


def jobs(ctx: Context) -> list[Job]:
    python = ray_python()
    if python is None:
        return []
    out = os.path.join(ctx.work, "out")
    commands = {
        "convert parquet->parquet": ("convert", ctx.parquet, out),
        "stratify exact uniform": ("stratify", ctx.parquet, out, "--target", "uniform"),
        f"bucket auto-{K} b{BATCH}": ("bucket", ctx.parquet, out, "--length", LENGTH, "--auto-buckets", str(K),
                                      "--batch-size", str(BATCH)),
    }
    return [Job(f"ray: {name}", ctx.rows, ctx.parquet_bytes,
                ours=Command(call="ray:cli", args={"argv": [*argv, "-q", "--engine", "ray"]}, python=python),
                peer=Command(call="ray:cli", args={"argv": [*argv, "-q", "--engine", "local"]}, python=python),
                peer_name="--engine local, same Python",
                note="local Ray cluster started and stopped by the command (counted); driver writes")
            for name, argv in commands.items()]


def cli(argv: list[str]) -> None:
    """Run one batchtool command in this process (so the measured process is the driver)."""
    from batchtool.cli import cli as command_line

    command_line.main(argv, prog_name="batchtool", standalone_mode=False)
