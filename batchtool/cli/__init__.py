"""The command line: a thin click layer over the library (one module per command group)."""

from __future__ import annotations

from batchtool.cli import check  # noqa: F401  (registers check)
from batchtool.cli import docs  # noqa: F401  (registers docs)
from batchtool.cli import io  # noqa: F401  (registers inspect, convert)
from batchtool.cli import mix  # noqa: F401  (registers mix)
from batchtool.cli import ops  # noqa: F401  (registers the commands of batchtool.ops.OPERATIONS)
from batchtool.cli import pipeline  # noqa: F401  (registers run)
from batchtool.cli.common import cli

__all__ = ["cli"]
