"""Training-side costs of `batchtool.load` over the bucket job's output: a shuffled epoch split over 4 ranks
(each rank's epoch, one after the other) vs the same epoch on 1 rank, and resuming from the middle of it.

Run after the bucket job (it reads bench_data/<size>/bucket-auto8). The resume figure excludes interpreter
start-up, so it is printed by the function rather than read from the table:

    python scripts/bench.py --call load:resume '{"dst": "bench_data/1GB/bucket-auto8"}'
"""

from __future__ import annotations

import os
import time

from bench import Command, Context, Job

RANKS = 4


def jobs(ctx: Context) -> list[Job]:
    kept = os.path.join(ctx.data, "bucket-auto8")
    return [
        Job(f"bucket load epoch: {RANKS} ranks vs 1", ctx.rows, ctx.parquet_bytes,
            ours=Command(call="load:rank_epochs", args={"dst": kept, "world_size": RANKS}),
            floor=Command(call="load:rank_epochs", args={"dst": kept, "world_size": 1}),
            note=f"shuffled epoch 1 of the bucket output: the {RANKS} ranks' parts read one after the other (ours) "
                 "vs the whole epoch on one rank (floor); ratio 1.00 = no cost for splitting; run after the bucket "
                 "job"),
    ]


def rank_epochs(dst: str, world_size: int) -> None:
    """Every rank's part of epoch 1, one rank after the other, as a trainer's ranks would read them."""
    import batchtool

    if not os.path.exists(os.path.join(dst, ".batchtool_manifest.json")):
        raise SystemExit(f"{dst}: no bucket output; run the bucket job first")
    batches = 0
    start = time.perf_counter()
    for rank in range(world_size):
        loader = batchtool.load(dst, rank=rank, world_size=world_size)
        loader.set_epoch(1)
        for _ in loader:
            batches += 1
    print(f"batches {batches} seconds {time.perf_counter() - start:.2f}")


def resume(dst: str, repeats: int = 5) -> None:
    """Seconds from opening the output to holding the first batch after the middle of epoch 1 (load,
    load_state_dict, first batch), best of `repeats` (each repeat opens the output anew)."""
    import batchtool

    loader = batchtool.load(dst)
    loader.set_epoch(1)
    state = {**loader.state_dict(), "position": len(loader) // 2}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        loader = batchtool.load(dst)
        loader.load_state_dict(state)
        next(iter(loader))
        best = min(best, time.perf_counter() - start)
    print(f"batches {len(loader)} resume_at {state['position']} seconds {best:.4f}")
