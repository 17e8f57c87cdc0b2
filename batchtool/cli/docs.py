"""`docs`: print the Markdown manuals shipped in the package, so `--help` can point to them after `pip install`."""

from __future__ import annotations

from importlib.resources.abc import Traversable

import click

from batchtool.cli.common import command, manuals
from batchtool.core.errors import UsageError


def _title(manual: Traversable) -> str:
    """The manual's first heading, without the '#'."""
    return manual.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")


@command("docs", "batchtool docs bucket")
@click.argument("topic", required=False)
def docs_cmd(topic: str | None) -> None:
    """Print the manual of TOPIC (a command, load or scaling) as Markdown; without TOPIC, list the topics."""
    found = manuals()
    if topic is None:
        click.echo("\n".join(f"{name:<10} {_title(manual)}" for name, manual in found.items()))
        return
    if topic not in found:
        raise UsageError(f"docs {topic!r}: no such topic; choose from {', '.join(found)}")
    click.echo(found[topic].read_text(encoding="utf-8"), nl=False)
