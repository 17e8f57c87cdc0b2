"""The commands generated from operation definitions (batchtool.ops.OPERATIONS): one factory, no click code per op."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from batchtool.cli.common import (command, input_options, make_output, make_run, memory_options, output_options,
                                  report, run_options, seed_option)
from batchtool.driver import run_operation
from batchtool.job import JobResult
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Kind, Operation
from batchtool.errors import flag, key
from batchtool.options import Option, build, fields, from_texts, required

Runner = Callable[..., JobResult]
"""How a command runs its op: run_operation(op, options, src, dst, output, run, *, seed, format, skip_corrupt)."""


def make_command(op: Operation, runner: Runner = run_operation) -> click.Command:
    """`batchtool NAME SRC DST --option ...`: the op's options generated from its schema, plus what every
    writing command takes (input, output and run options; --seed for a seeded op, --memory and --tmp-dir
    for one that spills), running through the driver."""
    names = [f.name for f, _ in fields(op.options)]

    def run_op(src: str, dst: str, input_format: str | None, skip_corrupt: bool, **kwargs: Any) -> None:
        given = {name: value for name in names if (value := kwargs.pop(name)) not in (None, ())}
        options = build(op.options, from_texts(op.options, given))
        seed = kwargs.pop("seed", 0)
        output, run = make_output(kwargs), make_run(kwargs)
        result = runner(op, options, src, dst, output, run, seed=seed, format=input_format, skip_corrupt=skip_corrupt)
        report(result.manifest, dst, run.quiet)

    run_op.__name__ = f"{op.name}_cmd"
    run_op.__doc__ = op.summary
    batches = True if op.kind is Kind.BATCHES else op.batches_flag or False
    fn = run_options(output_options(input_options(run_op), batches=batches))
    if op.spills:
        fn = memory_options(fn)
    if op.seeded:
        fn = seed_option(fn)
    for f, decl in reversed(fields(op.options)):
        decls = f"{flag(f.name)}/--no-{key(f.name)}" if decl.value.negatable else flag(f.name)
        fn = click.option(decls, f.name, **_click_settings(f, decl))(fn)
    fn = click.argument("dst")(fn)
    fn = click.argument("src")(fn)
    return command(op.name, op.example)(fn)


def _click_settings(f: dataclasses.Field, decl: Option) -> dict[str, Any]:
    """How click declares one option: a flag, or a (repeatable) text option; defaults are the dataclass's,
    shown in --help but applied by `build`, so a pipeline file gets the same ones."""
    if decl.value.negatable:  # given or not, the value is the form it means (--help shows the default's)
        return {"is_flag": True, "default": f.default, "show_default": True, "help": decl.help}
    if decl.value.is_flag:
        return {"is_flag": True, "default": None, "help": decl.help}
    shown = None if required(f) or f.default in (None, ()) else f.default
    return {"multiple": decl.value.multiple, "required": required(f), "metavar": decl.value.metavar,
            "help": decl.help + (f"  [default: {shown}]" if shown is not None else "")}


COMMANDS = {name: make_command(op) for name, op in OPERATIONS.items()}

__all__ = ["COMMANDS", "make_command"]
