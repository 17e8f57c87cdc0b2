"""batchtool: prepare sequence datasets for training, offline."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("batchtool")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+local"

from batchtool.dataset import Dataset, open_dataset  # noqa: E402
from batchtool.errors import BatchtoolError  # noqa: E402

__all__ = ["BatchtoolError", "Dataset", "open_dataset", "__version__"]
