"""`where` and `step`: at which steps of `batchtool.load` an example is handed out, and which examples a step holds
(batchtool.loader.steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from batchtool.cli.common import command

_ORDER_OPTIONS = [
    click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True,
                 help="The epoch (Loader.set_epoch)."),
    click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Ranks the batches are shared among (load's world_size)."),
    click.option("--seed", type=int, default=0, show_default=True, help="The seed of the epochs' orders (batchtool.load's `seed`)."),
]


def _order_options(rank_help: str, rank_default: int | None) -> Callable:
    """The arguments of batchtool.load that fix the order of its batches, the same for both commands."""
    rank = click.option("--rank", type=click.IntRange(min=0), default=rank_default, show_default=rank_default is not None,
                        help=rank_help)

    def apply(fn: Callable) -> Callable:
        for option in reversed([*_ORDER_OPTIONS[:2], rank, _ORDER_OPTIONS[2]]):
            fn = option(fn)
        return fn
    return apply


@command("where", "batchtool where sample_data/batches ex-00000683")
@click.argument("dst")
@click.argument("key")
@_order_options("Only this rank (default: every rank of --world-size).", None)
def where_cmd(dst: str, key: str, epoch: int, world_size: int, rank: int | None, seed: int, **kwargs: Any) -> None:
    """Print `step N batch B rank R` for each place batchtool.load(DST, ...) hands out the example KEY.

    KEY is the value of the example's `key` column (for pack output, a document's; or the column --key named
    when DST was written), else its row in the input: rows counted from 0 across the input's files in the order
    batchtool reads them (for mix, SOURCE:ROW, SOURCE the source's position). Steps count from 0 within the
    rank's epoch, as the loader yields them. Exit status: 0 found, 1 no example has KEY, 2 bad usage or
    unreadable DST.
    """
    from batchtool.loader.steps import key_places  # when the command runs: its --help reads no output

    for place in key_places(dst, key, epoch=epoch, world_size=world_size, rank=rank, seed=seed):
        click.echo(f"step {place.step} batch {place.batch} rank {place.rank}")


@command("step", "batchtool step sample_data/batches 3")
@click.argument("dst")
@click.argument("n", type=click.IntRange(min=0))
@_order_options("The rank whose N-th step it is.", 0)
def step_cmd(dst: str, n: int, epoch: int, world_size: int, rank: int, seed: int, **kwargs: Any) -> None:
    """Print the keys of the examples of step N, one a line: the N-th batch (from 0) batchtool.load(DST, ...)
    yields in the epoch on the rank.

    KEY is as `batchtool where` reads it. Exit status: 0, or 2 on bad usage (a step past the epoch) or an
    unreadable DST.
    """
    from batchtool.loader.steps import step_keys

    _, keys = step_keys(dst, n, epoch=epoch, world_size=world_size, rank=rank, seed=seed)
    click.echo("".join(f"{k}\n" for k in keys), nl=False)
