"""Buckets over two lengths: `bucket --length in_len --length out_len` against lhotse's DynamicBucketingSampler
with two-dimensional buckets, on a generated speech-like corpus (input lengths lognormal, output about a quarter
of the input with noise), by padding efficiency and the largest batch cost relative to the budget.

lhotse has no two-dimensional constraint of its own; its 2-D bucketing is DynamicBucketingSampler given bins of
(input, output) pairs and a constraint that places an example among them and fixes each bin's batch size, as NeMo's
FixedBucketBatchSizeConstraint2D does. `lhotse_grid` builds that the NeMo way: input bins from lhotse's own
`estimate_duration_buckets` on a sample of 10,000 rows (lhotse's default `num_cuts_for_bins_estimate`), each
split into output sub-bins at the sample's quantiles, a bin's upper edges its (input, output) lengths, and each
bin's batch size the budget over the cost of one row padded to them (rows x (in + out) <= T). Rows longer than the
sample's longest go to the last bin (lhotse's last bucket has no upper edge). Its batches are padded, as a collator
pads them, to their longest row in each dimension.

    LHOTSE_PYTHON=/path/to/venv/bin/python python scripts/bench.py --jobs "bucket grid*"    # timed, lhotse the peer
    LHOTSE_PYTHON=/path/to/venv/bin/python python scripts/bench.py --call bucket_grid:compare '{}'   # the figures
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import REPO, Command, Context, Job

K, K_IN, K_OUT = 16, 4, 4
"""Cells: batchtool's --auto-buckets K; lhotse's K_IN input bins x K_OUT output sub-bins."""
MAX_TOKENS = 20_000
"""The budget: rows x (padded input + padded output) of every batch."""
ROWS = 50_000
SAMPLE = 10_000
LHOTSE_PYTHON = os.environ.get("LHOTSE_PYTHON")
"""A Python with lhotse: a venv of its own with the CPU build of torch, then `pip install -e .[lhotse]` (without it,
the timed job has no peer and `compare` stops)."""


def speech_lengths(rows: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Input frames lognormal (median 500, sigma 0.6, 10 to 3,000), output tokens about input / 4 (x e^N(0, 0.2))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    first = np.clip(np.round(rng.lognormal(np.log(500), 0.6, rows)), 10, 3000).astype(np.int64)
    second = np.maximum(1, np.round(first / 4 * np.exp(rng.normal(0, 0.2, rows)))).astype(np.int64)
    return first.tolist(), second.tolist()


def speech_corpus(dst: str, rows: int = ROWS, seed: int = 0) -> str:
    """Parquet shards of the speech-like rows: `frames` (int8 steps) and `tokens` with `in_len` and `out_len`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.isdir(dst):
        return dst
    os.makedirs(dst + ".tmp", exist_ok=True)
    first, second = speech_lengths(rows, seed)
    per = 10_000
    for i in range(0, rows, per):
        a, b = np.array(first[i:i + per]), np.array(second[i:i + per])

        def lists(lengths: np.ndarray) -> pa.Array:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(int(offsets[-1]), np.int8)))

        pq.write_table(pa.table({"id": np.arange(i, i + len(a)), "frames": lists(a), "tokens": lists(b),
                                 "in_len": a, "out_len": b}),
                       os.path.join(dst + ".tmp", f"part-{i // per:05d}.parquet"), compression="zstd")
    os.rename(dst + ".tmp", dst)
    return dst


def bucket_args(src: str, dst: str, k: int = K, max_tokens: int = MAX_TOKENS) -> list[str]:
    return ["bucket", src, dst, "--length", "in_len", "--length", "out_len", "--sequence", "frames", "--sequence",
            "tokens", "--auto-buckets", str(k), "--max-tokens", str(max_tokens), "--overwrite", "-q"]


def lhotse_grid(rows: int = ROWS, k_in: int = K_IN, k_out: int = K_OUT, max_tokens: int = MAX_TOKENS,
                seed: int = 0, sample: int = SAMPLE) -> dict:
    """One epoch of lhotse's DynamicBucketingSampler with 2-D bins estimated from a sample (see the module's
    docstring); prints and returns its padding efficiency and largest batch cost."""
    import random
    from bisect import bisect_left
    from dataclasses import dataclass, field

    import numpy as np
    from lhotse import CutSet
    from lhotse.dataset.sampling.base import SamplingConstraint
    from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler, estimate_duration_buckets
    from lhotse.testing.dummies import dummy_cut

    first, second = speech_lengths(rows, seed)
    cuts = []
    for i, (a, b) in enumerate(zip(first, second)):
        cut = dummy_cut(i, duration=a / 100)  # 10 ms frames
        cut.custom = {"out": b}
        cuts.append(cut)
    cuts = CutSet.from_cuts(cuts)

    def lengths(cut) -> tuple[int, int]:
        return round(cut.duration * 100), cut.custom["out"]

    drawn = random.Random(seed).sample(range(rows), min(sample, rows))
    pairs = np.array([(first[i], second[i]) for i in drawn])
    edges = estimate_duration_buckets([cuts[i] for i in drawn], k_in)  # seconds, k_in - 1 of them
    inputs = np.searchsorted(np.array(edges) * 100, pairs[:, 0], side="right")
    bins = []
    for b in range(k_in):
        outs = np.sort(pairs[inputs == b, 1])
        top_in = int(pairs[inputs == b, 0].max())
        cuts_at = [int(outs[min(len(outs) - 1, int(len(outs) * q / k_out))]) for q in range(1, k_out)] + [int(outs[-1])]
        for top_out in sorted(set(cuts_at)):
            bins.append((top_in, top_out))
    sizes = [max(1, max_tokens // (a + b)) for a, b in bins]

    @dataclass
    class Constraint2D(SamplingConstraint):
        """A fixed batch size per (input, output) bin, a bin chosen as NeMo's 2-D constraint chooses it."""

        bins: list = field(default_factory=list)
        sizes: list = field(default_factory=list)
        num_examples: int = 0
        bucket: int = 0

        def select_bucket(self, buckets, example=None, example_len=None) -> int:
            length = example_len if example_len is not None else self.measure_length(example)
            i = min(bisect_left(self.bins, length), len(self.bins) - 1)
            while i + 1 < len(self.bins) and self.bins[i + 1][0] == self.bins[i][0] and self.bins[i][1] < length[1]:
                i += 1  # the bin of its input length whose output length first holds it (else the last)
            return i

        def add(self, example) -> None:
            self.bucket = self.select_bucket(self.bins, example)
            self.num_examples += 1

        def exceeded(self) -> bool:
            return self.num_examples > self.sizes[self.bucket]

        def close_to_exceeding(self) -> bool:
            return self.num_examples >= self.sizes[self.bucket]

        def reset(self) -> None:
            self.num_examples = 0

        def measure_length(self, example) -> tuple[int, int]:
            return lengths(example)

    sampler = DynamicBucketingSampler(cuts, constraint=Constraint2D(bins=bins, sizes=sizes), duration_bins=bins[:-1],
                                      shuffle=True, seed=seed, buffer_size=rows)
    real = padded = worst = over = batches = written = 0
    for batch in sampler:
        got = [lengths(c) for c in batch]
        cost = len(got) * (max(a for a, _ in got) + max(b for _, b in got))
        real += sum(a + b for a, b in got)
        padded += cost
        worst = max(worst, cost)
        over += cost > max_tokens
        batches += 1
        written += len(got)
    result = {"cells": len(bins), "rows": written, "batches": batches, "padding_efficiency": round(real / padded, 4),
              "max_batch_cost": worst, "batches_over_budget": over}
    print(json.dumps(result))
    return result


def batchtool_grid(src: str, dst: str, k: int = K, max_tokens: int = MAX_TOKENS,
                   python: str = sys.executable) -> dict:
    """`bucket` over both lengths; its figures from the manifest."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([python, "-m", "batchtool", *bucket_args(src, dst, k, max_tokens)], check=True, env=env)
    with open(os.path.join(dst, ".batchtool_manifest.json")) as f:
        stats = json.load(f)["stats"]
    return {"cells": sum(stats["grid"]), "rows": stats["rows_out"], "batches": stats["batches"],
            "padding_efficiency": round(stats["padding_efficiency"], 4), "max_batch_cost": stats["max_batch_cost"],
            "batches_over_budget": 0 if stats["max_batch_cost"] <= max_tokens else None, "grid": stats["grid"]}


def compare(rows: int = ROWS, k: int = K, k_in: int = K_IN, k_out: int = K_OUT, max_tokens: int = MAX_TOKENS,
            work: str = os.path.join(REPO, "bench_data", "speech"), batchtool_python: str = sys.executable,
            lhotse_python: str | None = LHOTSE_PYTHON) -> None:
    """Both sides on one corpus: a markdown table of padding efficiency and largest batch cost / budget."""
    if lhotse_python is None:
        raise SystemExit("compare needs a Python with lhotse: set LHOTSE_PYTHON (see the module's docstring)")
    src = speech_corpus(os.path.join(work, f"src-{rows}"), rows)
    ours = batchtool_grid(src, os.path.join(work, "out"), k, max_tokens, batchtool_python)
    args = json.dumps({"rows": rows, "k_in": k_in, "k_out": k_out, "max_tokens": max_tokens})
    done = subprocess.run([lhotse_python, os.path.join(REPO, "scripts", "bench.py"), "--call", "bucket_grid:lhotse_grid",
                           args], check=True, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "scripts")))
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{rows:,} rows, budget rows x (padded in + padded out) <= {max_tokens:,}\n")
    print("| sampler | cells | batches | padding efficiency | largest batch cost / budget | batches over budget |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    shape = " + ".join(map(str, ours["grid"]))
    for name, r in ((f"batchtool `bucket --auto-buckets {k}` (cells per input bucket: {shape})", ours),
                    (f"lhotse DynamicBucketingSampler, {k_in} x {k_out} bins from {SAMPLE:,} sampled rows", peer)):
        print(f"| {name} | {r['cells']} | {r['batches']:,} | {100 * r['padding_efficiency']:.1f}% | "
              f"{r['max_batch_cost'] / max_tokens:.3f} | {r['batches_over_budget']} |")


def jobs(ctx: Context) -> list[Job]:
    src = speech_corpus(os.path.join(ctx.data, "speech"), ROWS)
    out = os.path.join(ctx.work, "out")
    peer = Command(call="bucket_grid:lhotse_grid", args={"rows": ROWS}, python=LHOTSE_PYTHON) \
        if LHOTSE_PYTHON else None
    return [Job(f"bucket grid {K} cells, speech-like", ROWS, ROWS, ours=Command(batchtool=tuple(bucket_args(src, out))),
                peer=peer, peer_name="lhotse DynamicBucketingSampler, 2-D bins (samples lengths, writes nothing)",
                note=f"{ROWS:,} generated rows (frames lognormal, tokens ~ frames / 4), --max-tokens {MAX_TOKENS:,}; "
                     "padding and batch cost: `bench.py --call bucket_grid:compare '{}'`", output=out)]
