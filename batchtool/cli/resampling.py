"""`stratify`: its command is generated from its definition (cli/ops.py) and runs its own writer."""

from __future__ import annotations

from typing import Any

from batchtool.cli.ops import make_command
from batchtool.job import JobResult, RunSettings
from batchtool.ops import stratify as stratify_op
from batchtool.ops.stratify import Stratify, StratifyOptions
from batchtool.output import OutputOptions
from batchtool.stratify_writer import stratify


def _run_stratify(op: Stratify, options: StratifyOptions, src: str, dst: str, output: OutputOptions,
                  run: RunSettings, **kwargs: Any) -> JobResult:
    """stratify's passes and writer are still its own (batchtool.stratify_writer), not the driver's."""
    return stratify(src, dst, options, output, run, **kwargs)


stratify_cmd = make_command(stratify_op.OP, _run_stratify)
