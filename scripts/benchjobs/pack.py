"""Sequence packing: `pack --max-length 2048` vs a pyarrow floor (read, cut consecutive examples into rows,
build the same packed columns, write) and vs greedy first-fit in arrival order over the whole corpus
held in memory (what online packers do; TRL and torchtune are not installed here, so the peer is
batchtool.ops.pack.packing.first_fit, a max-tree first-fit in Python, feeding the same row builder).

Each measured function prints its packing efficiency (real steps / (rows x L)); the pack output is kept
in bench_data/<size>/pack-2048 so its manifest can be read next to bucket's (bucket-auto8-parquet-zstd).
"""

from __future__ import annotations

import glob
import os

from bench import Command, Context, Job

L, BATCH = 2048, 8
SEQUENCES = ("tokens", "frames")


def jobs(ctx: Context) -> list[Job]:
    out = os.path.join(ctx.work, "out")
    kept = os.path.join(ctx.data, f"pack-{L}")
    return [
        Job(f"pack L{L} b{BATCH}", ctx.rows, ctx.parquet_bytes,
            ours=Command(batchtool=("pack", ctx.parquet, kept, "--max-length", str(L), "--batch-size", str(BATCH),
                                    "--overwrite", "-q")),
            floor=Command(call="pack:pyarrow_floor", args={"src": ctx.parquet, "dst": out, "first_fit": False}),
            peer=Command(call="pack:pyarrow_floor", args={"src": ctx.parquet, "dst": out, "first_fit": True}),
            peer_name="greedy first-fit in arrival order (batchtool.ops.pack.packing.first_fit), all rows in memory",
            note="zstd Parquet in and out, one row group per 8 packed rows; floor = pyarrow read, consecutive "
                 "examples cut into rows as they arrive (next-fit), the same row builder and zstd write"),
        Job("pack --world-size 8 plan, 2M documents", 2_000_000, 0,
            ours=Command(call="pack:rank_plan", args={"docs": 2_000_000, "world_size": 8, "batch_size": 1}),
            note="the plan alone (packing and (step, rank) assignment) over lognormal lengths, sigma 1.5, capped at "
                 f"{RANK_L:,}; balance figures: `bench.py --call pack:rank_balance '{{}}'`"),
    ]


def pyarrow_floor(src: str, dst: str, first_fit: bool) -> None:
    """Floor (first_fit=False): stream row groups, cut consecutive examples into rows of at most L (next-fit,
    no plan, no spill, no reorder), build the packed columns with batchtool.ops.pack.assemble, write.
    Peer (first_fit=True): read everything, first-fit in arrival order, then the same building and writing."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchtool.ops.pack import packing
    from batchtool.ops.pack import PackColumns, PackOptions, output_schema
    from batchtool.ops.pack.rows import assemble
    from batchtool.io.padding import row_lengths

    files = sorted(glob.glob(os.path.join(src, "*.parquet")))
    schema = pq.ParquetFile(files[0]).schema_arrow
    columns = PackColumns(SEQUENCES, tuple(n for n in schema.names if n not in SEQUENCES))
    out_schema = output_schema(schema, columns, PackOptions(max_length=L, batch_size=BATCH))
    pads = {name: 0 for name in SEQUENCES}
    os.makedirs(dst, exist_ok=True)
    writer = pq.ParquetWriter(os.path.join(dst, "part-00000.parquet"), out_schema, compression="zstd")
    totals = {"rows": 0, "steps": 0, "batch": 0}

    def write(items: pa.RecordBatch, rows: np.ndarray) -> None:
        """Write items (sorted by row) as batches of BATCH rows padded to their longest row."""
        lengths = row_lengths(items.column(SEQUENCES[0]))
        starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
        for first in range(0, len(starts), BATCH):
            a = starts[first]
            b = starts[first + BATCH] if first + BATCH < len(starts) else len(rows)
            widest = int(np.bincount(rows[a:b] - rows[a], lengths[a:b]).max())
            writer.write_batch(assemble(items.slice(a, b - a), rows[a:b], totals["batch"], widest, out_schema,
                                        SEQUENCES, pads, columns.names))
            totals["batch"] += 1
        totals["rows"] += len(starts)
        totals["steps"] += int(lengths.sum())

    if first_fit:
        table = pa.concat_tables(pq.read_table(f) for f in files).combine_chunks()
        rows = packing.first_fit(row_lengths(table.column(SEQUENCES[0])).tolist(), L)
        order = np.argsort(rows, kind="stable")
        write(table.take(pa.array(order)).to_batches()[0], rows[order])
    else:
        def next_fit(batch: pa.RecordBatch) -> np.ndarray:
            rows, room, row = [], L, 0
            for length in row_lengths(batch.column(SEQUENCES[0])).tolist():
                if length > room:
                    row, room = row + 1, L
                rows.append(row)
                room -= length
            return np.array(rows, dtype=np.int64)

        pending: list[pa.RecordBatch] = []
        for path in files:
            pf = pq.ParquetFile(path)
            for rg in range(pf.metadata.num_row_groups):
                pending.append(pf.read_row_group(rg).combine_chunks().to_batches()[0])
                batch = pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
                rows = next_fit(batch)
                whole = int(np.searchsorted(rows, rows[-1] - rows[-1] % BATCH))  # keep the unfinished batch
                write(batch.slice(0, whole), rows[:whole])
                pending = [batch.slice(whole)]
        batch = pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
        if batch.num_rows:
            write(batch, next_fit(batch))
    writer.close()
    print(f"rows {totals['rows']} packing_efficiency {totals['steps'] / (totals['rows'] * L):.6f}")


RANK_L = 32_768
"""pack --world-size measurements: lognormal documents (sigma 1.5, median e^6 = 403 steps) capped at this, which is
also the row length, so every document fits whole."""


def _lognormal_counts(docs: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.maximum(1, rng.lognormal(6.0, 1.5, docs).astype(np.int64)), RANK_L)
    return np.bincount(lengths, minlength=RANK_L + 1)


def _ratios(loads):
    """(worst, mean) over steps of the max/mean rank cost of each step; loads is [steps, ranks]."""
    ratios = loads.max(axis=1) / loads.mean(axis=1)
    return float(ratios.max()), float(ratios.mean())


def rank_plan(docs: int, world_size: int, batch_size: int) -> None:
    """The plan of `pack --world-size` alone (histogram, packing, assignment), as the first pass hands it over."""
    import time

    from batchtool.ops.pack.packing import plan_packing
    from batchtool.ops.pack.ranks import assign_ranks

    counts = _lognormal_counts(docs)
    start = time.perf_counter()
    packing, _ = plan_packing(counts, RANK_L)
    plan = assign_ranks(packing, (1.0, 0.0), world_size, batch_size, seed=0)
    seconds = time.perf_counter() - start
    print(f"rows {packing.total_rows} steps {plan.steps} worst {plan.ratios.max():.4f} seconds {seconds:.3f}")


def rank_balance(docs: int = 200_000, batch_size: int = 1) -> None:
    """Balance and efficiency of `pack --world-size N` against a naive baseline (the same best-fit packing, rows in
    pack's keyed order dealt round-robin to the ranks, as `load(rank, world_size)` reads pack output without it)."""
    import numpy as np

    from batchtool.core import rng
    from batchtool.ops.pack.packing import plan_packing
    from batchtool.ops.pack.plan import ROW_STAGE
    from batchtool.ops.pack.ranks import assign_ranks, class_costs

    packing, _ = plan_packing(_lognormal_counts(docs), RANK_L)
    costs = np.repeat(class_costs(packing, (1.0, 0.0)), packing.rows)
    steps_of_row = np.repeat(packing.class_length, packing.rows)
    rows = packing.total_rows
    print(f"{docs:,} documents, {rows:,} rows of {RANK_L:,} steps ({packing.method}), batch size {batch_size}")
    print("| N | plan | steps | max/mean per step: worst | mean | token efficiency | rows dropped |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for N in (8, 64):
        plan = assign_ranks(packing, (1.0, 0.0), N, batch_size, seed=0)
        kept = len(plan.row_at)
        worst, mean = _ratios(costs[plan.row_at].reshape(-1, N, batch_size).sum(axis=2))
        eff = steps_of_row[plan.row_at].sum() / (kept * RANK_L)
        print(f"| {N} | pack --world-size {N} | {plan.steps:,} | {worst:.4f} | {mean:.4f} | {eff:.4%} | "
              f"{plan.dropped_rows} |")
        order = rng.index_shuffle(0, ROW_STAGE, np.arange(rows, dtype=np.uint64), rows, inverse=True).astype(np.int64)
        whole = rows - rows % (N * batch_size)  # the loader's drop_uneven drops the rest
        worst, mean = _ratios(costs[order[:whole]].reshape(-1, N, batch_size).sum(axis=2))
        eff = steps_of_row[order[:whole]].sum() / (whole * RANK_L)
        print(f"| {N} | best-fit + round-robin | {whole // (N * batch_size):,} | {worst:.4f} | {mean:.4f} | "
              f"{eff:.4%} | {rows - whole} |")
