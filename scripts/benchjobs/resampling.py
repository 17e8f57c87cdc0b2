"""Resampling: stratify (exact, to uniform) vs a pyarrow filter of the same rows and DuckDB; shuffle vs a copy."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys

from bench import Command, Context, Job
from benchjobs.io import pyarrow_copy


SELECTIONS = {"uniform": (0.25, 0.25, 0.25, 0.25), "0.8,0.14,0.04,0.02": (0.8, 0.14, 0.04, 0.02)}
"""stratify's targets measured, as --target and as the peer's class shares: uniform keeps 4 x the smallest class
(about 4% of the corpus's 90/7/2/1 % labels), the other half of it (class 1, 2 and 3 whole, 0.8/0.9 of class 0
sampled)."""


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    memory = ctx.parquet_bytes // 4
    peer_python = duckdb_python(ctx)
    return [
        *(Job(f"stratify exact {'uniform' if target == 'uniform' else 'half'}", ctx.rows, ctx.parquet_bytes,
              ours=Command(batchtool=("stratify", ctx.parquet, out, "--target", target, "-q")),
              floor=Command(call="resampling:pyarrow_filter",
                            args={"src": ctx.parquet, "dst": out, "mask": selection_mask(ctx, target)}),
              peer=Command(call="resampling:duckdb_stratify",
                           args={"src": ctx.parquet, "dst": out, "target": list(shares)},
                           python=peer_python) if peer_python else None,
              peer_name="DuckDB row_number() semijoin",
              note=f"90/7/2/1 % labels to {target} ({'4 x the smallest class' if target == 'uniform' else 'half'} "
                   "of the rows); floor = pyarrow read + filter of the same rows + zstd write")
          for target, shares in SELECTIONS.items()),
        Job(f"shuffle --memory {memory >> 20}MB", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=("shuffle", ctx.parquet, out, "--memory", str(memory), "-q")),
            floor=Command(call="resampling:pyarrow_copy", args={"src": ctx.parquet, "dst": out}),
            note="global permutation of a corpus 4 x the memory budget (on disk; more in memory); "
                 "floor = pyarrow copy"),
    ]


def duckdb_python(ctx: Context) -> str | None:
    """A Python that can import duckdb: this one, or --tf-python's."""
    if importlib.util.find_spec("duckdb") is not None:
        return sys.executable
    for python in filter(None, [ctx.tf_python]):
        if subprocess.run([python, "-c", "import duckdb"], capture_output=True).returncode == 0:
            return python
    return None


def selection_mask(ctx: Context, target: str = "uniform") -> str:
    """Which input rows `stratify --target TARGET` keeps (seed 0), as a boolean .npy in input order.

    Computed once with batchtool itself and cached beside the corpus, so the floor is given the same
    rows without timing their selection.
    """
    import numpy as np
    import pyarrow.parquet as pq

    from batchtool.exec.driver import run_operation
    from batchtool.core.run_settings import RunSettings
    from batchtool.ops.stratify import OP, StratifyOptions
    from batchtool.ops.targets import parse_target
    from batchtool.io.output import OutputOptions

    name = "uniform" if target == "uniform" else target.replace(",", "_")
    path = os.path.join(ctx.data, "cache", f"stratify_{name}_seed0_mask.npy")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(ctx.data, "cache", f"stratify_{name}_seed0")
        run_operation(OP, StratifyOptions(target=parse_target(target)), ctx.parquet, tmp, OutputOptions(overwrite=True),
                      RunSettings(threads=ctx.threads, quiet=True))
        kept = set(pq.read_table(glob.glob(os.path.join(tmp, "part-*.parquet")), columns=["key"])
                   .column("key").to_pylist())
        keys = pq.read_table(ctx.parquet, columns=["key"]).column("key").to_pylist()
        np.save(path, np.fromiter((k in kept for k in keys), dtype=bool, count=len(keys)))
        shutil.rmtree(tmp)
    return path


def pyarrow_filter(src: str, dst: str, mask: str) -> None:
    """The floor: the pyarrow copy, keeping only the masked rows of each row group."""
    import numpy as np
    import pyarrow as pa

    keep = np.load(mask)
    start = [0]

    def select(table: pa.Table) -> pa.Table:
        first, start[0] = start[0], start[0] + table.num_rows
        return table.filter(pa.array(keep[first:start[0]]))

    pyarrow_copy(src, dst, transform=select)


def duckdb_stratify(src: str, dst: str, target: list[float]) -> None:
    """The peer: the same job in DuckDB SQL. Class counts, then row_number() over a random order within
    each label on the (key, label) columns, keeping floor(M * t_i) of class i, where M = min(n_i / t_i) is the
    largest total the target allows (the smallest class's count of each for a uniform target), then a semijoin
    fetching those rows, written as zstd Parquet."""
    import duckdb

    os.makedirs(dst, exist_ok=True)
    files = f"read_parquet('{os.path.join(src, '*.parquet')}')"
    shares = ", ".join(f"({i}, {float(t)!r})" for i, t in enumerate(target) if t > 0)
    duckdb.sql(f"""
        COPY (
            WITH t(label, p) AS (VALUES {shares}),
                 m AS (SELECT min(n / p) AS m FROM (SELECT label, count(*) AS n FROM {files} GROUP BY label)
                       JOIN t USING (label)),
                 ranked AS (SELECT key, label, row_number() OVER (PARTITION BY label ORDER BY r) AS rn
                            FROM (SELECT key, label, random() AS r FROM {files}))
            SELECT * FROM {files} WHERE key IN (
                SELECT key FROM ranked JOIN t USING (label), m WHERE rn <= floor(m.m * t.p))
        ) TO '{os.path.join(dst, "part-00000.parquet")}' (FORMAT parquet, COMPRESSION zstd)
    """)
