"""The command line: a thin click layer over the library, each command's module imported only when it is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

import click

from batchtool.cli.common import CONTEXT, Group
from batchtool.core.version import version_line
from batchtool.ops import DECLARATIONS

OWN_COMMANDS = {
    "check": "batchtool.cli.check",
    "convert": "batchtool.cli.io",
    "docs": "batchtool.cli.docs",
    "inspect": "batchtool.cli.io",
    "mix": "batchtool.cli.mix",
    "run": "batchtool.cli.pipeline",
    "step": "batchtool.cli.steps",
    "where": "batchtool.cli.steps",
}
"""The commands written by hand, each the `NAME_cmd` of its module; every other op of DECLARATIONS has the command
cli/ops.py generates from its declaration."""


class Commands(Mapping[str, click.Command]):
    """The group's commands by name, each made when first asked for: `batchtool segment` imports segment's declaration (and
    its kernels and the driver once it runs), not check's evaluator, the other ops or Ray; `batchtool --help` asks for them all
    (their short help)."""

    def __init__(self) -> None:
        self._names = sorted({*OWN_COMMANDS, *DECLARATIONS})
        self._made: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._made:
            if name in OWN_COMMANDS:
                self._made[name] = getattr(importlib.import_module(OWN_COMMANDS[name]), f"{name}_cmd")
            elif name in DECLARATIONS:
                from batchtool.cli.ops import make_command

                self._made[name] = make_command(DECLARATIONS[name])
            else:
                raise KeyError(name)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _version(ctx: click.Context, param: click.Parameter, given: bool) -> None:
    """--version, as click's version_option says it, reading the installed version (importlib.metadata) only then."""
    if given and not ctx.resilient_parsing:
        click.echo(version_line())
        ctx.exit()


@click.group(cls=Group, commands=Commands(), context_settings=CONTEXT)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
def cli(debug: bool) -> None:
    """Prepare sequence datasets for training, offline.

    Reads Parquet and TFRecord shards, resamples, buckets and segments them, and
    writes pre-batched shards plus a manifest of what it did.

    \b
    Example:
      batchtool inspect sample_data/parquet --label label
    """


__all__ = ["cli"]
