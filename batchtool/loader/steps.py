"""Which examples step N of `batchtool.load` hands out, and at which steps an example is handed out: the output's
example index (batchtool.io.example_index) read through the loader's own order (Loader.epoch_batches), so the
answers are what a loader opened with the same arguments yields."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchtool.core.errors import InputError, UsageError
from batchtool.io.example_index import ExampleIndex, NotFoundError, open_index
from batchtool.loader.load import Loader, load


@dataclass(frozen=True)
class Place:
    """One place an example is handed out: the step of rank `rank` (its position in that rank's epoch) and the
    batch (its number in the output, files in order)."""

    step: int
    batch: int
    rank: int


def _loader(dst: str, epoch: int, world_size: int, rank: int, seed: int) -> Loader:
    if epoch < 0:
        raise UsageError(f"epoch {epoch}: must be at least 0")
    loader = load(dst, seed=seed, rank=rank, world_size=world_size, threads=1)
    loader.set_epoch(epoch)
    return loader


def index_of(dst: str, loader: Loader) -> ExampleIndex:
    """The example index of the output `loader` reads; an InputError for a directory batchtool did not write."""
    if not loader.manifest:
        raise InputError(f"{dst}: not a batchtool output (no manifest, so no example index)")
    return open_index(dst, loader.manifest)


def step_keys(dst: str, step: int, *, epoch: int = 0, world_size: int = 1, rank: int = 0,
              seed: int = 0) -> tuple[int, list[str | int]]:
    """(the batch, the keys of its examples in order) of the `step`-th batch (from 0) that
    `batchtool.load(dst, seed=seed, rank=rank, world_size=world_size)` yields in epoch `epoch`."""
    loader = _loader(dst, epoch, world_size, rank, seed)
    batches = loader.epoch_batches()
    if not 0 <= step < len(batches):
        raise UsageError(f"step {step}: rank {rank} of {world_size} has {len(batches)} steps in epoch {epoch} "
                         f"of {dst} (0..{len(batches) - 1})")
    batch = int(batches[step])
    return batch, index_of(dst, loader).keys_of(batch)


def key_places(dst: str, key: str, *, epoch: int = 0, world_size: int = 1, rank: int | None = None,
               seed: int = 0) -> list[Place]:
    """Every place in epoch `epoch` where an example with key `key` (as the command line gives it) is handed out,
    by rank (`rank`, or every rank of `world_size`), then step. A NotFoundError when no example has the key;
    an empty list when the epoch's order hands none of its batches to these ranks (drop_uneven's remainder)."""
    loader = _loader(dst, epoch, world_size, 0 if rank is None else rank, seed)
    index = index_of(dst, loader)
    batches = index.batches_of(index.parse(key))
    if not len(batches):
        raise NotFoundError(f"{dst}: no example has key {key!r} ({_keys_are(index)})")
    places = []
    for r in range(world_size) if rank is None else [rank]:
        order = loader.epoch_batches(r)
        steps = np.flatnonzero(np.isin(order, batches))
        places += [Place(int(s), int(order[s]), r) for s in steps]
    return places


def _keys_are(index: ExampleIndex) -> str:
    return f"keys are its {index.column!r} column" if index.column else "keys are example numbers in the output"


__all__ = ["Place", "index_of", "key_places", "step_keys"]
