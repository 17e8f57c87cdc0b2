"""The operations, each one module or package; DECLARATIONS and OPERATIONS register them (ops/base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchtool.core.registry import Registry

if TYPE_CHECKING:
    from batchtool.ops.base import Declaration, Operation

MODULES = {name: f"batchtool.ops.{name}" for name in (
    "filter", "select", "rename", "resample", "stratify", "pack", "bucket", "segment", "shuffle", "mix")}
"""Name -> the module that declares the op (its DECLARED, importing no kernel) and gives its OP."""

DECLARATIONS: Registry[Declaration] = Registry(MODULES, "DECLARED")
"""Name -> declaration (each imported when first asked for): the command and the pipeline stage of each are made from
it, so `segment --help` or reading a pipeline file imports no kernel."""

OPERATIONS: Registry[Operation] = Registry(MODULES, "OP")
"""Name -> definition, imported when the op runs (a command imports the op it runs, not every op): the run and the dry
run of each are derived from it."""

__all__ = ["DECLARATIONS", "OPERATIONS"]
