"""The commands generated from operation definitions (batchtool.ops.OPERATIONS): one factory, no click code per op."""

from __future__ import annotations

from typing import Any

import click

from batchtool.cli.common import command, input_options, make_output, make_run, output_options, report, run_options
from batchtool.driver import run_operation
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Operation, build, fields, flag, required


def make_command(op: Operation) -> click.Command:
    """`batchtool NAME SRC DST --option ...`: the op's options generated from its schema, plus what every
    writing command takes (input, output and run options), running through the driver."""
    names = [f.name for f, _ in fields(op.options)]

    def run_op(src: str, dst: str, input_format: str | None, skip_corrupt: bool, **kwargs: Any) -> None:
        given = {name: list(value) if isinstance(value, tuple) else value
                 for name in names if (value := kwargs.pop(name)) not in (None, ())}
        options = build(op.options, given)
        output, run = make_output(kwargs), make_run(kwargs)
        result = run_operation(op, options, src, dst, output, run, format=input_format, skip_corrupt=skip_corrupt)
        report(result.manifest, dst, run.quiet)

    run_op.__name__ = f"{op.name}_cmd"
    run_op.__doc__ = op.summary
    fn = run_options(output_options(input_options(run_op)))
    for f, decl in reversed(fields(op.options)):
        fn = click.option(flag(f.name), f.name, multiple=decl.value.multiple, required=required(f),
                          metavar=decl.value.metavar, help=decl.help)(fn)
    fn = click.argument("dst")(fn)
    fn = click.argument("src")(fn)
    return command(op.name, op.example)(fn)


COMMANDS = {name: make_command(op) for name, op in OPERATIONS.items()}

__all__ = ["COMMANDS", "make_command"]
