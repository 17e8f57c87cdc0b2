"""Training-side costs of `batchtool.load`: one epoch per batch format (the bucket and segment modules list
those jobs), its floors (touching the same arrays already in memory; copying them once out of the memory map,
what writable arrays at least cost), a shuffled epoch split over 4 ranks, resuming from the middle of an
epoch, `where`/`step` lookups in the example index of an output of 10^7 examples, and building that index.

Epoch functions print `seconds N` measured inside the process (open to last batch, interpreter start-up
excluded); bench.py reports that figure rather than the process's wall time. The resume figure is printed
by its function only:

    python scripts/bench.py --call load:resume '{"dst": "bench_data/1GB/bucket-auto8-arrow"}'
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from bench import Command, Context, Job

RANKS = 4
LOOKUP_EXAMPLES = 10**7
LOOKUP_BATCH = 256
INDEX_MEMORY = 64 << 20
"""The --memory the index build is measured under: far less than the 10^7 keys' index (240 MB)."""
FORMATS: dict[str, tuple[str, ...]] = {
    "arrow": ("--to", "arrow", "--compression", "none"),
    "arrow zstd": ("--to", "arrow", "--compression", "zstd"),
    "arrow lz4": ("--to", "arrow", "--compression", "lz4"),
    "parquet zstd": ("--to", "parquet", "--compression", "zstd"),
    "tfrecord": ("--to", "tfrecord", "--compression", "none"),
}
"""Batch formats the batching commands are measured writing (and `load` reading): name -> CLI options."""


def kept(ctx: Context, base: str, fmt: str) -> str:
    """Where the output of job `base` in format `fmt` is kept for the load jobs that follow it."""
    return os.path.join(ctx.data, f"{base}-{fmt.replace(' ', '-')}")


def jobs(ctx: Context) -> list[Job]:
    dst = kept(ctx, "bucket-auto8", "arrow")
    return [
        *(Job(f"bucket load warm epoch {fmt}: verify on vs off", ctx.rows, ctx.parquet_bytes,
              ours=Command(call="load:warm_epochs", args={"dst": kept(ctx, "bucket-auto8", fmt), "verify": True}),
              floor=Command(call="load:warm_epochs", args={"dst": kept(ctx, "bucket-auto8", fmt), "verify": False}),
              note="best warm epoch of batchtool.load over the bucket output, every column to NumPy and touched: "
                   "verify on (the default: each batch's CRC32C checked) vs off; ratio 1.10 = the checks cost 10%; "
                   "run after the bucket jobs")
          for fmt in ("arrow", "arrow lz4")),
        Job(f"bucket load epoch: {RANKS} ranks vs 1", ctx.rows, ctx.parquet_bytes,
            ours=Command(call="load:rank_epochs", args={"dst": dst, "world_size": RANKS}),
            floor=Command(call="load:rank_epochs", args={"dst": dst, "world_size": 1}),
            note=f"shuffled epoch 1 of the bucket arrow output: the {RANKS} ranks' parts read one after the other "
                 "(ours) vs the whole epoch on one rank (floor); ratio 1.00 = no cost for splitting; run after the "
                 "bucket jobs"),
        Job(f"where / step on {LOOKUP_EXAMPLES:.0e} examples", LOOKUP_EXAMPLES, 0,
            ours=Command(call="load:lookups", args={"dst": os.path.join(ctx.data, "indexed-1e7"),
                                                    "examples": LOOKUP_EXAMPLES}),
            note="median seconds of one `where` (every place a random key is handed out, 4 ranks) and one `step` "
                 "(the keys of a random step) in process, each opening the output anew, over a bucket output of "
                 f"{LOOKUP_EXAMPLES:.0e} one-step examples in batches of {LOOKUP_BATCH} (made once, untimed)"),
        Job(f"example index build on {LOOKUP_EXAMPLES:.0e} examples, --memory 64MB", LOOKUP_EXAMPLES, 0,
            ours=Command(call="load:index_build", args={"dst": os.path.join(ctx.data, "indexed-1e7"),
                                                        "examples": LOOKUP_EXAMPLES, "memory": INDEX_MEMORY}),
            note="seconds of building the example index of the lookups' output anew in process (keys sorted in "
                 "runs spilled and merged); its peak growth is printed beside"),
    ]


def epoch_jobs(ctx: Context, base: str, title: str, peer: Command, peer_name: str) -> list[Job]:
    """One `load` epoch per format over the kept outputs of job `base`, each against a floor over the arrow output
    (writable arrays, the default: copying the arrays once out of the memory map and touching them;
    writable=False: touching them in memory) and the tf.data pipeline `peer` (each measured once per run)."""
    arrow = kept(ctx, base, "arrow")
    copy_floor = Command(call="load:memory_copy_floor", args={"dst": arrow})
    touch_floor = Command(call="load:in_memory_floor", args={"dst": arrow})
    note = ("one pass of batchtool.load over the {} output, every column to NumPy and touched (seconds inside "
            "the process); floor = {}; peer = the tf.data pipeline's epoch, every column to NumPy and touched")
    copied = "the same bytes copied once from the memory map into fresh NumPy arrays, touched"
    return [
        *(Job(f"{title} load epoch {fmt}", ctx.rows, ctx.parquet_bytes,
              ours=Command(call="load:epoch", args={"dst": kept(ctx, base, fmt)}),
              floor=copy_floor, peer=peer, peer_name=peer_name, note=note.format(fmt, copied))
          for fmt in FORMATS),
        Job(f"{title} load epoch arrow writable=False", ctx.rows, ctx.parquet_bytes,
            ours=Command(call="load:epoch", args={"dst": arrow, "writable": False}),
            floor=touch_floor, peer=peer, peer_name=peer_name,
            note=note.format("arrow", "touching the same arrays, already in memory")
            + "; writable=False: read-only views of the memory map, no copy"),
    ]


def touch(batch: dict[str, Any]) -> float:
    """Read every byte of every numeric array (a sum), and every string array's length: what a training
    step at least does with a batch."""
    total = 0.0
    for array in batch.values():
        total += float(array.sum()) if array.dtype != object else len(array)
    return total


def epoch(dst: str, writable: bool = True) -> None:
    """One epoch of batchtool.load (its defaults, or read-only arrays): every batch as a dict of NumPy
    arrays, touched. Timed from load() to the last batch, after batchtool.load's imports (numpy, pyarrow: a
    training process has them; the floors import them untimed too), which are printed apart (import_s); cpu_s:
    this process's CPU seconds over the epoch, its reading threads' included (steadier on a shared machine)."""
    import importlib

    import batchtool

    if not os.path.exists(os.path.join(dst, ".batchtool_manifest.json")):
        raise SystemExit(f"{dst}: no output; run the job that writes it first")
    start = time.perf_counter()
    importlib.import_module("batchtool.loader.load")
    imported, cpu = time.perf_counter(), time.process_time()
    batches = 0
    for batch in batchtool.load(dst, writable=writable):
        touch(batch)
        batches += 1
    seconds = time.perf_counter() - imported
    print(f"batches {batches} seconds {seconds:.3f} batches_per_s {batches / seconds:.0f} "
          f"cpu_s {time.process_time() - cpu:.3f} import_s {imported - start:.3f}")


def warm_epochs(dst: str, verify: bool, repeats: int = 5) -> None:
    """Warm epochs of batchtool.load (its defaults, `verify` as given), every batch to NumPy and touched: after one
    epoch that pages the files in and imports what reading needs, the best of `repeats`: wall seconds, this
    process's CPU seconds over that epoch (its reading threads' included) and the training loop's thread's own
    (what the epoch takes where the reading threads have cores of their own, steadier than wall time on a busy
    machine)."""
    import batchtool

    if not os.path.exists(os.path.join(dst, ".batchtool_manifest.json")):
        raise SystemExit(f"{dst}: no output; run the job that writes it first")
    best = (float("inf"), 0.0, 0.0)
    for repeat in range(repeats + 1):
        start, cpu, loop = time.perf_counter(), time.process_time(), time.thread_time()
        batches = sum(touch(batch) is not None for batch in batchtool.load(dst, verify=verify))
        took = (time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - loop)
        if repeat:
            best = min(best, took)
    print(f"batches {batches} verify {verify} seconds {best[0]:.3f} cpu_s {best[1]:.3f} loop_cpu_s {best[2]:.3f}")


def _held(dst: str) -> list[dict[str, Any]]:
    """Every batch of `dst` as read-only NumPy views of its memory-mapped Arrow IPC files, paged in by a pass."""
    import batchtool

    held = list(batchtool.load(dst, shuffle=False, writable=False))
    for batch in held:
        touch(batch)
    return held


def in_memory_floor(dst: str) -> None:
    """The floor of a writable=False epoch: every batch of `dst` held as NumPy arrays (zero-copy views of the
    memory-mapped Arrow IPC output, paged in by a first pass), then a timed second pass touching them all."""
    held = _held(dst)
    start, cpu = time.perf_counter(), time.process_time()
    for batch in held:
        touch(batch)
    print(f"batches {len(held)} seconds {time.perf_counter() - start:.3f} cpu_s {time.process_time() - cpu:.3f}")


def memory_copy_floor(dst: str) -> None:
    """The floor of a writable epoch (the default): the same views as in_memory_floor, each array copied once into
    a fresh NumPy array (a plain memory copy out of the page cache) and the copy touched."""
    held = _held(dst)
    start, cpu = time.perf_counter(), time.process_time()
    for batch in held:
        touch({name: array.copy() for name, array in batch.items()})
    print(f"batches {len(held)} seconds {time.perf_counter() - start:.3f} cpu_s {time.process_time() - cpu:.3f}")


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


def costs(dst: str, repeats: int = 3) -> None:
    """On one output, writable=False unless said, in CPU seconds of this process (its reader threads included;
    steadier than wall time on a shared machine): a fresh loader's first epoch vs its second; an epoch with
    the batch checks (always on) vs without (private switch), both verify=False, vs the CRC32C verified (the
    default) vs writable=True; the checks alone over the epoch's batches; the floor (the same arrays already in memory, touched); and
    source[i] per batch in random order. Each epoch figure is the best of `repeats`, every batch touched."""
    import random

    import batchtool
    from batchtool.io.batch_check import check_batch, unchecked

    def timed(loader) -> float:
        start = time.process_time()
        for batch in loader:
            touch(batch)
        return time.process_time() - start

    def best(make) -> float:
        return min(timed(make()) for _ in range(repeats))

    fresh = batchtool.load(dst, writable=False, verify=False)
    first, second = timed(fresh), timed(fresh)
    checked = best(lambda: batchtool.load(dst, writable=False, verify=False))
    with unchecked():
        unchecked_s = best(lambda: batchtool.load(dst, writable=False, verify=False))
        batches = list(batchtool.load(dst, shuffle=False, verify=False).record_batches())
    start = time.process_time()
    for i, batch in enumerate(batches):
        check_batch(batch, dst, i)
    checks = time.process_time() - start
    verified = best(lambda: batchtool.load(dst, writable=False, verify=True))
    copied = best(lambda: batchtool.load(dst, verify=False))
    held = list(batchtool.load(dst, shuffle=False, writable=False, verify=False))
    floor = min(timed(held) for _ in range(repeats))
    source = batchtool.source(dst, writable=False)
    picks = random.Random(0).sample(range(len(source)), min(len(source), 2000))
    start = time.perf_counter()
    for i in picks:
        touch(source[i])
    per_item = (time.perf_counter() - start) / len(picks)
    print(json.dumps({"batches": len(fresh), "first_epoch_s": round(first, 3), "second_epoch_s": round(second, 3),
                      "checked_s": round(checked, 3), "unchecked_s": round(unchecked_s, 3),
                      "checks_alone_s": round(checks, 3), "verify_s": round(verified, 3),
                      "writable_s": round(copied, 3), "floor_s": round(floor, 3),
                      "checks_share_of_unchecked_epoch": round(checks / unchecked_s, 3),
                      "verify_cost": round(verified / checked - 1, 3), "source_item_ms": round(per_item * 1000, 3)}))


def indexed_output(dst: str, examples: int, batch_size: int = LOOKUP_BATCH) -> None:
    """A bucket output of `examples` one-step examples keyed 0..examples-1 (kept: made once, by batchtool itself)."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.exists(os.path.join(dst, ".batchtool_manifest.json")):
        return
    src = dst + "-src"
    os.makedirs(src, exist_ok=True)
    keys = np.arange(examples, dtype=np.int64)
    tokens = pa.ListArray.from_arrays(pa.array(np.arange(examples + 1, dtype=np.int32)),
                                      pa.array(np.ones(examples, dtype=np.int8)))
    pq.write_table(pa.table({"key": keys, "tokens": tokens}), os.path.join(src, "part-00000.parquet"))
    subprocess.run([sys.executable, "-m", "batchtool", "bucket", src, dst, "--boundaries", "2", "--batch-size",
                    str(batch_size), "--sequence", "tokens", "--to", "arrow", "--quiet"], check=True)


def lookups(dst: str, examples: int, repeats: int = 21) -> None:
    """Median in-process seconds of `batchtool where` (4 ranks) and `batchtool step` lookups of random keys and
    steps, each opening the output and its index anew, as the commands do; `seconds` is the slower of the two."""
    import random
    import statistics

    from batchtool.loader.steps import key_places, step_keys

    indexed_output(dst, examples)
    draw = random.Random(0)
    key_places(dst, "0", world_size=RANKS)  # (imports, and pages the index's first levels in)
    where_s, step_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        places = key_places(dst, str(draw.randrange(examples)), world_size=RANKS)
        where_s.append(time.perf_counter() - start)
        assert len(places) == 1
        start = time.perf_counter()
        step_keys(dst, draw.randrange(examples // LOOKUP_BATCH // RANKS), world_size=RANKS, rank=1)
        step_s.append(time.perf_counter() - start)
    where, step = statistics.median(where_s), statistics.median(step_s)
    print(f"examples {examples} seconds {max(where, step):.4f} where_s {where:.4f} step_s {step:.4f}")


def index_build(dst: str, examples: int, memory: int = 1 << 30) -> None:
    """Seconds and peak memory of building the example index of the lookups' output (made once, untimed) anew, in
    process under `memory` (--memory), the same bytes as recorded: the build alone, as a write ends with it."""
    import tempfile

    from batchtool.io import example_index
    from batchtool.io.workspace import Workspace

    indexed_output(dst, examples)
    with open(os.path.join(dst, ".batchtool_manifest.json")) as f:
        manifest = json.load(f)
    recorded = manifest["output"].pop("index")
    with tempfile.TemporaryDirectory() as space:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here on
        base = _status_bytes("VmRSS:")
        start = time.perf_counter()
        entry = example_index.build_index(dst, manifest, Workspace(space, dst), memory)
        seconds = time.perf_counter() - start
    assert entry == recorded, "the index is not the bytes recorded"
    print(f"examples {examples} seconds {seconds:.2f} memory {memory} "
          f"peak_growth_mib {(_status_bytes('VmHWM:') - base) / 2**20:.0f}")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(field)).split()[1]) << 10
