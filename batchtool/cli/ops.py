"""The commands generated from operation declarations (batchtool.ops.DECLARATIONS): one factory, no click code per op;
an op of several sources has its own command (cli/mix.py). An op's kernels (batchtool.ops.OPERATIONS) are imported
only when it runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from batchtool.cli.common import (command, input_options, make_output, make_run, memory_options, output_options,
                                  report, run_options, seed_option)
from batchtool.ops import OPERATIONS
from batchtool.ops.base import Declaration, Kind
from batchtool.core.errors import flag, key
from batchtool.core.options import Option, build_options, fields, from_texts, required


def make_command(op: Declaration) -> click.Command:
    """`batchtool NAME SRC DST --option ...`: the op's options generated from its schema, plus what every
    writing command takes (input, output and run options; --seed for a seeded op, --memory and --tmp-dir
    for one that spills), running the op through the driver (both imported when the command runs: its --help needs
    neither)."""
    def run_op(src: str, dst: str, input_format: str | None, skip_corrupt: bool, **kwargs: Any) -> None:
        from batchtool.exec.driver import run_operation

        options = given_options(op, kwargs)
        seed = kwargs.pop("seed", 0)
        output, run = make_output(kwargs), make_run(kwargs)
        result = run_operation(OPERATIONS[op.name], options, src, dst, output, run, seed=seed, format=input_format,
                               skip_corrupt=skip_corrupt)
        report(result.manifest, dst, run.quiet, op.writes_batches(options))

    run_op.__name__ = f"{op.name}_cmd"
    run_op.__doc__ = op.summary
    fn = click.argument("dst")(op_options(op, run_op))
    fn = click.argument("src")(fn)
    return command(op.name, op.example)(fn)


def op_options(op: Declaration, fn: Callable) -> Callable:
    """`fn` with the op's options, generated from its schema, and what every writing command takes (input, output
    and run options; --seed for a seeded op, --memory and --tmp-dir for one that spills)."""
    batches = True if op.kind is Kind.BATCHES else op.batches_flag or False
    keyed = any(f.name == "key" for f, _ in fields(op.options))
    fn = run_options(output_options(input_options(fn), batches=batches, keyed=keyed))
    if op.spills:
        fn = memory_options(fn)
    if op.seeded:
        fn = seed_option(fn)
    for f, decl in reversed(fields(op.options)):
        decls = f"{flag(f.name)}/--no-{key(f.name)}" if decl.value.negatable else flag(f.name)
        fn = click.option(decls, f.name, **_click_settings(f, decl))(fn)
    return fn


def given_options(op: Declaration, kwargs: dict[str, Any], **settled: Any) -> Any:
    """Pop the op's options out of a command's kwargs and build them (`settled`: values the command worked out,
    instead of the flags' texts)."""
    given = {f.name: value for f, _ in fields(op.options) if (value := kwargs.pop(f.name)) not in (None, ())}
    return build_options(op.options, from_texts(op.options, {**given, **settled}))


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


__all__ = ["given_options", "make_command", "op_options"]
