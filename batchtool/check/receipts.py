"""`check DST --receipts`: whether the receipts of training runs (batchtool.loader.receipts) show each example of each
finished epoch handed out exactly once, or two runs handing out the same batches step for step; the first example
or step that breaks it is named, by its key (the output's example index)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtool.core.errors import InputError, UsageError
from batchtool.io.example_index import ExampleIndex
from batchtool.loader.load import load
from batchtool.loader.order import epoch_order
from batchtool.loader.receipts import Receipt, read_receipts
from batchtool.loader.steps import index_of


@dataclass(frozen=True)
class Verdict:
    """Whether the receipts pass, and the one line that says why."""

    passed: bool
    line: str

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


@dataclass(frozen=True)
class _Output:
    """What the receipts are judged against: DST's batches per file (the epoch orders) and its example index."""

    dst: str
    file_batches: np.ndarray
    index: ExampleIndex

    @classmethod
    def open(cls, dst: str) -> _Output:
        loader = load(dst, threads=1, shuffle=False)
        files = np.array([f["batches"] for f in loader.manifest["output"]["files"]], dtype=np.int64) \
            if loader.manifest else np.zeros(0, dtype=np.int64)
        return cls(dst, files, index_of(dst, loader))

    @property
    def batches(self) -> int:
        return int(self.file_batches.sum())

    def example(self, batch: int) -> str:
        """How a verdict names a batch: its first example's key, and the batch."""
        key = self.index.first_key(batch)
        return f"batch {batch}" if key is None else f"example {key!r} (batch {batch})"


def _read(output: _Output, paths: Sequence[str]) -> list[tuple[Receipt, str, int]]:
    """Every receipt of the files, with its file and line; an InputError for one of another output or order."""
    out = []
    for path in paths:
        for line, receipt in enumerate(read_receipts(path), 1):
            if receipt.batches != output.batches or receipt.batch >= output.batches:
                raise InputError(f"receipt {path}, line {line}: batch {receipt.batch} of {receipt.batches:,}, but "
                                 f"{output.dst} has {output.batches:,} batches; the receipt is another output's")
            out.append((receipt, path, line))
    return out


def _shown(found: tuple[Receipt, str, int]) -> str:
    receipt, path, line = found
    return f"step {receipt.step} rank {receipt.rank} ({path}, line {line})"


def exactly_once(dst: str, paths: Sequence[str]) -> Verdict:
    """Each epoch's handed-out batches, all receipts together, are the start of the epoch's order, each once;
    a finished epoch's (one a later epoch follows, or one whose remaining batches are fewer than its ranks, which
    drop_uneven leaves out) are all of it but that remainder. Fails at the first example, epochs in order and
    batches in the epoch's order, handed out twice or never."""
    output = _Output.open(dst)
    receipts = _read(output, paths)
    if not receipts:
        raise UsageError(f"--receipts {' '.join(paths)}: no receipt in them")
    by_epoch: dict[int, list[tuple[Receipt, str, int]]] = {}
    for found in receipts:
        by_epoch.setdefault(found[0].epoch, []).append(found)
    epochs = sorted(by_epoch)
    examples = 0
    finished = 0
    for epoch in epochs:
        mine = by_epoch[epoch]
        orders = {(r.seed, r.shuffle) for r, _, _ in mine}
        if len(orders) > 1:
            raise UsageError(f"receipts of epoch {epoch} come from loaders of different orders (seed, shuffle: "
                             f"{sorted(orders)}); each run of a training must load with the same")
        seed, shuffle = orders.pop()
        order, _ = epoch_order(output.file_batches, seed, epoch, shuffle)
        where = np.empty(output.batches, dtype=np.int64)
        where[order] = np.arange(len(order))
        first: dict[int, tuple[Receipt, str, int]] = {}
        for found in sorted(mine, key=lambda f: where[f[0].batch]):
            batch = found[0].batch
            if batch in first:
                return Verdict(False, f"{output.example(batch)} of epoch {epoch} was handed out twice: "
                                      f"{_shown(first[batch])} and {_shown(found)}")
            first[batch] = found
        handed = np.zeros(output.batches, dtype=bool)
        handed[list(first)] = True
        in_order = handed[order]
        furthest = max(where[b] for b in first)
        last = first[int(order[furthest])][0]  # the run that went furthest: its ranks end the epoch
        remainder = last.world_size - 1 if last.drop_uneven else 0
        done = epoch != epochs[-1] or len(first) >= output.batches - remainder
        # a stopped run's last step may have reached some of its ranks only
        reach = output.batches - remainder if done else int(furthest) + 1 - (last.world_size - 1)
        gaps = np.flatnonzero(~in_order[:max(reach, 0)])
        if len(gaps):
            return Verdict(False, f"{output.example(int(order[gaps[0]]))} of epoch {epoch} was never handed out "
                                  f"(position {int(gaps[0])} of the epoch's order; later ones were)")
        finished += done
        examples += int(sum(len(output.index.keys_of(b)) for b in first)) if done else 0
    return Verdict(True, f"exactly once: {finished} finished epoch(s) of {dst}, {examples:,} examples handed out once "
                         f"each ({len(receipts):,} receipts)")


def same_prefix(dst: str, paths: Sequence[str]) -> Verdict:
    """Two runs (one receipt file each) handed out the same batch at every (epoch, step, rank) both reached, up to
    where the shorter one stopped; fails at the first that differs."""
    if len(paths) != 2:
        raise UsageError(f"--same-prefix compares two runs: give --receipts twice (got {len(paths)})")
    output = _Output.open(dst)
    runs = [{(r.epoch, r.step, r.rank): (r, path, line) for r, path, line in _read(output, [path])} for path in paths]
    if not all(runs):
        raise UsageError(f"--receipts {' '.join(paths)}: a run without receipts has no prefix to compare")
    end = min(max((e, s) for e, s, _ in run) for run in runs)
    steps = sorted(k for k in set(runs[0]) | set(runs[1]) if k[:2] <= end)
    for key in steps:
        a, b = runs[0].get(key), runs[1].get(key)
        if a is None or b is None or a[0].batch != b[0].batch:
            epoch, step, rank = key
            shown = [f"{output.example(r[0].batch)} in {r[1]}" if r else f"nothing in {p}" for r, p in zip((a, b), paths)]
            return Verdict(False, f"step {step} of epoch {epoch}, rank {rank}: {shown[0]}, {shown[1]}")
    return Verdict(True, f"same prefix: {len(steps):,} steps (to epoch {end[0]} step {end[1]}) hand out the same batches")


__all__ = ["Verdict", "exactly_once", "same_prefix"]
