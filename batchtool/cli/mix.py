"""`mix`: several sources in exact proportions. Its options are generated from its definition as every op's are; its
command is its own, since it takes several SRCs (`batchtool mix SRC SRC [SRC ...] DST`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from batchtool.cli.common import columns_option, command, make_output, make_run, report
from batchtool.cli.ops import given_options, op_options
from batchtool.core.errors import UsageError
from batchtool.ops import OPERATIONS
from batchtool.ops.mix import DECLARED as MIX
from batchtool.ops.mix.options import Names


def mix_cmd(paths: tuple[str, ...], columns: tuple[str, ...], input_format: str | None, skip_corrupt: bool,
            continue_from: str | None, at: int | None, **kwargs: Any) -> None:
    from batchtool.exec.driver import run_mixed  # when the command runs: its --help needs none of the driver
    from batchtool.io.mixed import source_names
    from batchtool.ops.mix.schedule import replan_from

    if len(paths) < 3:
        raise UsageError(f"mix takes at least two sources and DST (SRC SRC [SRC ...] DST); got {len(paths)} path(s)")
    *srcs, dst = paths
    given = kwargs.get("names")
    names = source_names(srcs, Names().parse("names", given) if given else ())
    options = given_options(MIX, kwargs, names=list(names))
    if (continue_from is None) != (at is None):
        raise UsageError("--continue DST and --at STEP go together")
    if continue_from is not None:
        if not options.weighted:
            raise UsageError("--continue needs --schedule or --by tokens (the plan it changes to)")
        options = replace(options, previous=replan_from(continue_from, int(at or 0), options.names, options.by))
    seed = kwargs.pop("seed", 0)
    output, run = make_output(kwargs), make_run(kwargs)
    result = run_mixed(OPERATIONS[MIX.name], options, srcs, options.names, options.column, dst, output, run,
                       seed=seed, format=input_format, skip_corrupt=skip_corrupt, columns=list(columns) or None)
    report(result.manifest, dst, run.quiet, MIX.writes_batches(options))


mix_cmd.__doc__ = f"""{MIX.summary}

    Each SRC is anything batchtool reads as one input (a file, a directory, a quoted glob, a URI); no file may be in
    two. By default the mixture is the largest that uses no row twice: exactly floor(M*w_i) rows of source i,
    M = min_i n_i/w_i, chosen by keyed hash; its rows are shuffled, and each carries its source's index in the
    column `source` (the manifest names each). The sources must have the same columns with the same types.
    """
mix_cmd = command("mix", MIX.example)(
    click.argument("paths", nargs=-1, required=True, metavar="SRC SRC [SRC ...] DST")(
        columns_option("--columns", help="Columns to keep of every source, in this order (default: all).")(
            click.option("--continue", "continue_from", metavar="DST", default=None,
                         help="Re-plan: the batches of DST (a mix by --schedule or --by tokens of the same sources) "
                              "before --at STEP, byte for byte, then the rows after them by this command's "
                              "--schedule (or weights), none lost or repeated beyond the caps.")(
                click.option("--at", type=int, metavar="STEP", default=None,
                             help="With --continue: the first batch that follows the new plan.")(
                    op_options(MIX, mix_cmd))))))
