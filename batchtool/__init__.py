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

# pyarrow's allocator (mimalloc) keeps freed pages for a while by default; returning them at once
# cuts peak RSS by about a third on streaming jobs at no measurable cost. It only takes effect when
# batchtool is imported before pyarrow (always so for the CLI); a user's own setting wins.
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")

if TYPE_CHECKING:
    from batchtool.dataset import Dataset
    from batchtool.errors import BatchtoolError
    from batchtool.inputs import open_dataset
    from batchtool.load import Loader, load
    from batchtool.source import Source, source

_EXPORTS = {"BatchtoolError": "batchtool.errors", "Dataset": "batchtool.dataset",
            "open_dataset": "batchtool.inputs", "Loader": "batchtool.load", "load": "batchtool.load",
            "Source": "batchtool.source", "source": "batchtool.source"}


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value: object = version("batchtool")
        except PackageNotFoundError:  # running from a source tree that was not installed
            value = "0.0.0+local"
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
