"""batchtool: prepare sequence datasets for training, offline.

The public names are imported on first use, so `import batchtool` (and the `batchtool` command,
see batchtool.entry) starts without loading pyarrow: the command sets its signal handlers first.
"""

from __future__ import annotations

import os
import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING

# pyarrow's allocator (mimalloc) returns freed pages to the kernel after MIMALLOC_PURGE_DELAY ms. At 0 every
# freed batch's pages are faulted in again by the next (830,000 minor faults and 6-7 s of system time for a
# bucket of 200 MB that takes 6 s of user time); at 100 a third of the faults and of the system time remain, for
# 50-70 MB more peak RSS (every job stays under 1 GB at the default --memory). It only takes effect when batchtool
# is imported before pyarrow (always so for the CLI); a user's own setting wins (0: the least memory).
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "100")

if TYPE_CHECKING:
    from batchtool.io.dataset import Dataset
    from batchtool.core.errors import BatchtoolError
    from batchtool.io.inputs import open_dataset
    from batchtool.loader.load import Loader, load
    from batchtool.loader.source import Source, source

_EXPORTS = {"BatchtoolError": "batchtool.core.errors", "Dataset": "batchtool.io.dataset",
            "open_dataset": "batchtool.io.inputs", "Loader": "batchtool.loader.load", "load": "batchtool.loader.load",
            "Source": "batchtool.loader.source", "source": "batchtool.loader.source"}


def __getattr__(name: str) -> object:
    if name == "__version__":
        from batchtool.core.version import version

        value: object = version()
    elif name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'batchtool' has no attribute {name!r}")
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Keeps `batchtool.load` the function: importing the submodule batchtool.load would otherwise
    replace the attribute with the module (the import system sets it on the package)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["BatchtoolError", "Dataset", "Loader", "Source", "load", "open_dataset", "source", "__version__"]
