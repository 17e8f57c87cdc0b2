"""`pack`: the command line of batchtool.ops.pack."""

from __future__ import annotations

from typing import Any

import click

from batchtool.cli.common import (
    command,
    input_options,
    make_output,
    make_run,
    output_options,
    SIZE,
    columns_option,
    parse_size,
    run_options,
    report,
)
from batchtool.errors import UsageError
from batchtool.ops.pack import PackOptions, pack


@command("pack", "batchtool pack sample_data/parquet /tmp/packed --max-length 512 --sequence tokens --batch-size 8")
@click.argument("src")
@click.argument("dst")
@click.option("--max-length", type=int, required=True, metavar="L", help="Steps per packed row, at most.")
@columns_option("--sequence", "sequences",
              help="A sequence (list) column to pack; repeat for several, which must agree in length "
                   "(default: every list column).")
@click.option("--max-examples-per-row", type=int, metavar="K", help="At most K examples in a row.")
@click.option("--split-long", is_flag=True,
              help="Cut examples longer than L into pieces of at most L steps (marked in source_offset).")
@click.option("--drop-long", is_flag=True, help="Drop (and count) examples longer than L.")
@click.option("--batch-size", type=int, metavar="B", help="Packed rows per batch.")
@click.option("--max-tokens", type=int, metavar="T",
              help="Instead of --batch-size: at most T padded steps (rows x padded length) per batch.")
@click.option("--pad-to-max-length", is_flag=True,
              help="Pad every batch to L steps (default: to the batch's longest row).")
@click.option("--pad-value", "pad_values", multiple=True, metavar="COL=V",
              help="Pad value of a sequence column (default 0, '' for strings); repeatable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--memory", type=SIZE, default="1GB", show_default=True, metavar="SIZE",
              help="Memory for assembling rows; the rest spills to temporary files.")
@click.option("--tmp-dir", help="Directory for spill files (default: the system temp directory).")
@input_options
@output_options(batches=True)
@run_options
def pack_cmd(src: str, dst: str, seed: int, input_format: str | None, skip_corrupt: bool, **kwargs: Any) -> None:
    """Pack whole sequences into rows of at most L steps, for transformer training without padding waste.

    Which lengths share a row is planned once over the whole length histogram (near the optimum,
    which the summary states); which examples fill those rows, and the order of the rows, are seeded
    random. DST gets the packed sequence columns with segment_ids and positions per step, cu_seqlens,
    num_examples and length per row, and every other column as a list of one value per example.
    """
    output = make_output(kwargs)
    run = make_run(kwargs)
    options = pack_options(**kwargs)
    result = pack(src, dst, options, output, run, seed=seed, format=input_format, skip_corrupt=skip_corrupt)
    report(result.manifest, dst, run.quiet)


def pack_options(*, max_length: int, sequences: tuple[str, ...], max_examples_per_row: int | None, split_long: bool,
                 drop_long: bool, batch_size: int | None, max_tokens: int | None, pad_to_max_length: bool,
                 pad_values: tuple[str, ...], memory: str, tmp_dir: str | None) -> PackOptions:
    """pack's options from its flags' values (shared with pipeline files, whose keys are the flags)."""
    if split_long and drop_long:
        raise UsageError("give at most one of --split-long and --drop-long")
    return PackOptions(max_length=max_length, sequences=sequences, max_examples_per_row=max_examples_per_row,
                       long="split" if split_long else "drop" if drop_long else "error", batch_size=batch_size,
                       max_tokens=max_tokens, pad_to_max_length=pad_to_max_length, pad_values=pad_values,
                       memory=parse_size(memory), tmp_dir=tmp_dir)
