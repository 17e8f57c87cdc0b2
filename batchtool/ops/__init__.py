"""The operations, each one module; OPERATIONS registers those written to the operation interface (ops/base.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchtool.ops.base import Operation


class Registry(Mapping[str, "Operation"]):
    """Name -> definition, each op's module imported when that op is first asked for: a command imports the op it
    runs, not every op (`batchtool segment` loads no bucket or pack code); the names are known without importing."""

    def __init__(self, modules: dict[str, str]) -> None:
        self._modules = modules

    def __getitem__(self, name: str) -> Operation:
        return importlib.import_module(self._modules[name]).OP

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


OPERATIONS = Registry({
    "filter": "batchtool.ops.filter",
    "select": "batchtool.ops.select",
    "rename": "batchtool.ops.rename",
    "resample": "batchtool.ops.resample",
    "stratify": "batchtool.ops.stratify",
    "pack": "batchtool.ops.pack",
    "bucket": "batchtool.ops.bucket",
    "segment": "batchtool.ops.segment",
    "shuffle": "batchtool.ops.shuffle",
    "mix": "batchtool.ops.mix",
})
"""Name -> definition (each op's module defines its OP): the command, the pipeline stage and the dry run of each are
derived from it."""

__all__ = ["OPERATIONS", "Registry"]
