"""`inspect` and `convert`: the commands that only read and rewrite shards."""

from __future__ import annotations

import json

import click

from batchtool.cli.common import (columns_option, command, input_options, make_output, make_run, output_options,
                                  report, run_options)


@command("inspect", "batchtool inspect sample_data/parquet --label label --length tokens")
@click.argument("src")
@click.option("--label", help="Integer label column to count (default: 'label' if present).")
@click.option("--length", "length", help="Length column, or a sequence column whose steps are counted "
                                         "(default: the first list column).")
@click.option("--sequence", "sequence", help="Alias of --length for a sequence column.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@input_options
@run_options
def inspect_cmd(src: str, label: str | None, length: str | None, sequence: str | None, as_json: bool,
                input_format: str | None, skip_corrupt: bool, **kwargs) -> None:
    """Show schema, shards, rows and bytes, the label distribution and the length histogram of SRC.

    SRC is a Parquet, Arrow IPC or TFRecord file, a directory or a glob. When SRC is a batchtool
    output directory its manifest is summarised too.
    """
    from batchtool.exec import inspection  # when it runs: --help (and `batchtool --help`) needs none of it

    result = inspection.inspect(src, label=label, length=length or sequence, format=input_format,
                                skip_corrupt=skip_corrupt, run=make_run(kwargs))
    click.echo(json.dumps(result, indent=2) if as_json else inspection.render(result))


@command("convert", "batchtool convert sample_data/parquet /tmp/tfr --to tfrecord")
@click.argument("src")
@click.argument("dst")
@columns_option("--columns", help="Columns to keep, in this order (default: all).")
@input_options
@output_options
@run_options
def convert_cmd(src: str, dst: str, columns: tuple[str, ...], input_format: str | None, skip_corrupt: bool,
                **kwargs) -> None:
    """Rewrite SRC as batch shards in DST (Parquet, TFRecord or Arrow IPC), row for row, with a manifest."""
    from batchtool.exec.convert import convert as convert_dataset  # when it runs, as the driver for an op's command

    output = make_output(kwargs)
    run = make_run(kwargs)
    result = convert_dataset(src, dst, output, columns=list(columns) or None,
                             format=input_format, skip_corrupt=skip_corrupt, run=run)
    report(result.manifest, dst, run.quiet, batches=False)
