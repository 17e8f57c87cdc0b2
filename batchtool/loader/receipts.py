"""Receipts: the log `batchtool.load(..., receipt=PATH)` appends a line to for each batch it hands out (epoch, step,
rank, batch and the arguments that fix the order), across resumes and world sizes; `check --receipts` reads it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, Protocol

from batchtool.core import fs
from batchtool.core.errors import InputError

MAX_LINE_BYTES = 4096
"""A receipt line is about 120 bytes: a longer one is not a receipt (and is never read whole)."""


class Ordered(Protocol):
    """What a receipt records of the loader handing a batch out (batchtool.Loader)."""

    epoch: int
    rank: int
    world_size: int
    seed: int
    shuffle: bool
    drop_uneven: bool

    @property
    def num_batches(self) -> int: ...


@dataclass(frozen=True)
class Receipt:
    """One handed-out batch: `step` is its position among the rank's batches of the epoch (from 0 for a run resumed
    on another world size, whose ranks share what remains), `batch` its number in the output (files in order);
    `batches`, `seed`, `shuffle` and `drop_uneven` fix the epoch's order."""

    epoch: int
    step: int
    rank: int
    world_size: int
    batch: int
    batches: int
    seed: int
    shuffle: bool
    drop_uneven: bool

    @classmethod
    def of(cls, loader: Ordered, step: int, batch: int) -> Receipt:
        """The receipt of `loader` handing out batch `batch` as its step `step` of the epoch."""
        return cls(epoch=loader.epoch, step=step, rank=loader.rank, world_size=loader.world_size, batch=int(batch),
                   batches=loader.num_batches, seed=loader.seed, shuffle=loader.shuffle,
                   drop_uneven=loader.drop_uneven)

    def line(self) -> bytes:
        return (json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, separators=(",", ":")) + "\n").encode()


_TYPES = {f.name: bool if f.type == "bool" else int for f in fields(Receipt)}


class ReceiptLog:
    """An append-only receipt file: each line one os.write on a descriptor opened with O_APPEND, so DataLoader
    worker processes (each its own descriptor) and resumed runs append whole lines, never interleaved ones."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def append(self, receipt: Receipt) -> None:
        if self._fd is None:
            with fs.write_errors(f"receipt {self.path}: cannot append"):
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        with fs.write_errors(f"receipt {self.path}: cannot append"):
            os.write(self._fd, receipt.line())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": None}


def read_receipts(path: str) -> list[Receipt]:
    """Every receipt in the file, in its order; an InputError naming the file and line of anything else. A last
    line without its newline is a write the process did not finish (that batch was not handed out): left out."""
    if not fs.is_file(path):
        raise InputError(f"receipt {path}: no such file")
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    raise InputError(f"receipt {path}, line {number}: longer than {MAX_LINE_BYTES} bytes; not a receipt")
                break
            out.append(_parse(raw, path, number))
    return out


def _parse(raw: bytes, path: str, number: int) -> Receipt:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or set(data) != set(_TYPES):
        raise InputError(f"receipt {path}, line {number}: not a receipt line (expected a JSON object with "
                         f"{', '.join(_TYPES)})")
    for name, kind in _TYPES.items():
        value = data[name]
        if type(value) is not kind or (kind is int and value < 0 and name != "seed"):
            raise InputError(f"receipt {path}, line {number}: {name} is {value!r}, expected "
                             f"{'true or false' if kind is bool else 'an integer' if name == 'seed' else 'a non-negative integer'}")
    return Receipt(**data)


__all__ = ["Receipt", "ReceiptLog", "read_receipts"]
