"""`batchtool.source`: random access to the batches of an output (`len`, `source[i]`), for Grain's data sources,
PyTorch's map-style datasets and their samplers, which shuffle and shard the indices themselves."""

from __future__ import annotations

import copy
import operator
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from batchtool.io.formats.base import Stacked
from batchtool.loader.arrays import StackViews, hand_out, to_numpy
from batchtool.core.errors import UsageError
from batchtool.loader.load import _Layout, _Opened, _Reading, open_output

OPEN_FILES = 64
"""Files a source keeps open (footers parsed, maps held) before it lets them all go and opens afresh."""


class Source(_Opened):
    """The batches of DST in file order, by index: `source[i]` is batch i of the whole output (global,
    unshuffled, unsharded), as {column: array}, read and checked as `batchtool.load` reads it (zero-copy
    read-only views of Arrow IPC output with writable=False). Thread-safe; pickles without its open files,
    so worker processes reopen what they read."""

    def __init__(self, reading: _Reading, layout: _Layout, writable: bool) -> None:
        super().__init__(reading, layout, writable)
        self._lock = threading.Lock()
        self._cache: dict = {}
        self._stacks = StackViews(writable, layout.batches.unsliced)

    def __len__(self) -> int:
        """Batches in the whole output."""
        return self._layout.total

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {i}: {self.dataset.src} has {n} batches")
        i %= n
        file, local = self._layout.locate(np.array([i], dtype=np.int64))
        batches = self._layout.batches
        with self._lock:
            if len(self._cache) >= OPEN_FILES:
                batches.release(self._cache)
            read = self._reading.read(batches, int(file[0]), local, self._cache)
        batch = read()[0]
        read.check()
        batch = self._reading.handed_out(batch, lambda: self._layout.where(i))
        if isinstance(batch, Stacked):  # (the stack's arrays are kept for the batches after it)
            return hand_out(self._stacks(batch, lambda: self._layout.where(i)), self.writable, False)
        return to_numpy(batch, writable=self.writable, where=lambda: self._layout.where(i))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"], state["_cache"], state["_stacks"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _cache={},
                             _stacks=StackViews(state["writable"], state["_layout"].batches.unsliced))

    def __repr__(self) -> str:
        return f"batchtool.source({self.dataset.src!r}): {len(self)} batches"

    @staticmethod
    def dataloader_state(state: dict[str, Any], num_workers: int) -> dict[str, Any]:
        """A torchdata StatefulDataLoader state saved with K >= 1 workers over a Source, for a loader with
        `num_workers` >= 1: StatefulDataLoader refuses another worker count outright, but over a Source its
        workers hold no state (the sampler, in the main process, knows where the stream is), so only the count
        and the workers' empty entries change. The resumed loader yields exactly the rest of the stream."""
        if num_workers < 1:
            raise UsageError(f"num_workers={num_workers}: a state saved with workers resumes with 1 or more")
        snapshot = state.get("_snapshot") if isinstance(state, dict) else None
        if not isinstance(snapshot, dict) or "_main_snapshot" not in snapshot:
            raise UsageError("dataloader_state: pass what StatefulDataLoader.state_dict() returned with num_workers "
                             ">= 1")
        for worker in (snapshot.get("_worker_snapshots") or {}).values():
            if worker.get("dataset_state") is not None or worker.get("fetcher_state") is not None:
                raise UsageError("dataloader_state: the state's workers hold state of their own (not a "
                                 "batchtool.source dataset); their number cannot change")
        out = copy.deepcopy(state)
        snapshot = out["_snapshot"]
        snapshot["_main_snapshot"]["_num_workers"] = num_workers
        snapshot["_worker_snapshots"] = {f"worker_{w}": {"worker_id": w, "dataset_state": None, "fetcher_state": None}
                                         for w in range(num_workers)}
        snapshot["_last_yielded_worker_id"] = num_workers - 1
        return out


def source(dst: str, *, columns: Sequence[str] | None = None, writable: bool = True,
           verify: bool | None = None) -> Source:
    """Open a batch-shard output for random access: `len(source)` batches, `source[i]` the i-th in file order.
    verify as batchtool.load's (default: each batch's checksum checked wherever the output records them).
    See `batchtool docs load` (Random access)."""
    dst = os.fspath(dst)
    reading, layout, _ = open_output(dst, columns, verify)
    return Source(reading, layout, writable)
