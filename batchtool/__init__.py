"""batchtool: prepare sequence datasets for training, offline.

The public names are imported on first use, so `import batchtool` (and the `batchtool` command,
see batchtool.entry) starts without loading pyarrow: the command sets its signal handlers first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from batchtool.core.registry import exports

# pyarrow's allocator (mimalloc) returns freed pages to the kernel after MIMALLOC_PURGE_DELAY ms. At 0 every
# freed batch's pages are faulted in again by the next (830,000 minor faults and 6-7 s of system time for a
# bucket of 200 MB that takes 6 s of user time); at 100 a third of the faults and of the system time remain, for
# 50-70 MB more peak RSS (every job stays under 1 GB at the default --memory). pyarrow 26's mimalloc defaults to
# 1000, which spares a quarter of bucket's system time more but takes its peak RSS to 985 MB on that corpus
# (docs/benchmarks.md, "pages"). It only takes effect when batchtool is imported before pyarrow (always so for the
# CLI); a user's own setting wins (0: the least memory).
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "100")

if TYPE_CHECKING:
    from batchtool.core.errors import BatchtoolError
    from batchtool.exec.convert import convert
    from batchtool.exec.driver import run_operation as run
    from batchtool.core.run_settings import RunSettings
    from batchtool.io.dataset import Dataset
    from batchtool.io.inputs import open_dataset
    from batchtool.io.output import OutputOptions
    from batchtool.loader.load import Loader, load
    from batchtool.loader.source import Source, source
    from batchtool.pipeline.execute import run_pipeline

_EXPORTS = {
    # the training side: an output's batches
    "load": ("batchtool.loader.load", "load"), "Loader": ("batchtool.loader.load", "Loader"),
    "source": ("batchtool.loader.source", "source"), "Source": ("batchtool.loader.source", "Source"),
    # the write side: an op, a pipeline or a conversion from SRC to DST, how to run it and write it
    "run": ("batchtool.exec.driver", "run_operation"), "run_pipeline": ("batchtool.pipeline.execute", "run_pipeline"),
    "convert": ("batchtool.exec.convert", "convert"), "RunSettings": ("batchtool.core.run_settings", "RunSettings"),
    "OutputOptions": ("batchtool.io.output", "OutputOptions"),
    # reading a SRC, and what fails
    "open_dataset": ("batchtool.io.inputs", "open_dataset"), "Dataset": ("batchtool.io.dataset", "Dataset"),
    "BatchtoolError": ("batchtool.core.errors", "BatchtoolError"),
}
"""Public name: (module, name there), imported on first use."""


_export = exports(globals(), _EXPORTS)


def __getattr__(name: str) -> object:
    if name != "__version__":
        return _export(name)
    from batchtool.core.version import version

    value = globals()[name] = version()
    return value


__all__ = sorted(_EXPORTS) + ["__version__"]
