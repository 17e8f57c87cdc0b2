"""`segment`: the CLI of batchtool.ops.segment (truncated-BPTT segments in lane-stable batches)."""

from __future__ import annotations

from typing import Any

import click

from batchtool.cli.common import (SIZE, columns_option, command, input_options, make_output, make_run, output_options,
                                  parse_size, report, run_options)
from batchtool.ops.segment import DEFAULT_MEMORY, SegmentOptions, segment


@command("segment", "batchtool segment sample_data/parquet /tmp/seg --key key --sequence tokens,frames "
                    "--context label --num-unroll 20 --batch-size 32")
@click.argument("src")
@click.argument("dst")
@click.option("--key", required=True, help="Unique string key of each example (input_key).")
@columns_option("--sequence", "sequences", required=True,
                help="Sequence (list) columns sharing one time axis, split into segments (input_sequences).")
@click.option("--num-unroll", type=int, required=True, help="Steps per segment (num_unroll).")
@click.option("--batch-size", type=int, required=True, help="Rows (lanes) per batch (batch_size).")
@columns_option("--context", help="Per-example columns copied to every segment (input_context).")
@click.option("--input-length", metavar="COL",
              help="Integer column of real steps before padding (input_length; default: the sequence length).")
@click.option("--pad/--no-pad", default=True, show_default=True,
              help="Pad each sequence to a multiple of --num-unroll, or require one (pad).")
@click.option("--pad-value", "pad_values", multiple=True, metavar="COL=VALUE",
              help="Pad value of a sequence column (default 0, False or ''); repeatable.")
@click.option("--initial-state", "initial_states", multiple=True, metavar="NAME=COL",
              help="Write COL's value as column NAME on each example's first segment, zeros on the others "
                   "(initial_states); repeatable.")
@click.option("--allow-small-batch", is_flag=True,
              help="Drop the empty rows of the final batches instead of writing padding rows (allow_small_batch).")
@click.option("--world-size", type=int, default=1, show_default=True, metavar="N",
              help="Write N lane-stable streams with equal batch counts, one per training rank "
                   "(read with batchtool.load(DST, rank=r, world_size=N)).")
@click.option("--memory", type=SIZE, default=f"{DEFAULT_MEMORY >> 30}GB", show_default=True, metavar="SIZE",
              help="Memory for the duplicate-key check before it spills to --tmp-dir.")
@click.option("--tmp-dir", type=click.Path(file_okay=False), help="Where spills go (default: the system temp dir).")
@input_options
@output_options(batches=True)
@run_options
def segment_cmd(src: str, dst: str, memory: str, tmp_dir: str | None, input_format: str | None, skip_corrupt: bool,
                **kwargs: Any) -> None:
    """Split sequences into --num-unroll-step segments and write lane-stable batches for truncated BPTT.

    Row b of every batch is lane b: it plays one example's segments in order in consecutive
    batches, then the next example's, so a trainer carries its state per lane and resets
    lane b where sequence == 0. Read the output with batchtool.load(DST). With --world-size N,
    each of N training ranks gets its own B lanes and the same number of batches.
    """
    output = make_output(kwargs)
    run = make_run(kwargs)
    options = segment_options(**kwargs)
    result = segment(src, dst, options, output, format=input_format, skip_corrupt=skip_corrupt, run=run,
                     memory=parse_size(memory), tmp_dir=tmp_dir)
    report(result.manifest, dst, run.quiet)

def segment_options(*, key: str, sequences: tuple[str, ...], num_unroll: int, batch_size: int,
                    context: tuple[str, ...], input_length: str | None, pad: bool, pad_values: tuple[str, ...],
                    initial_states: tuple[str, ...], allow_small_batch: bool, world_size: int = 1) -> SegmentOptions:
    """segment's options from its flags' values (shared with pipeline files, whose keys are the flags)."""
    return SegmentOptions(key=key, sequences=sequences, num_unroll=num_unroll, batch_size=batch_size,
                          context=context or None, input_length=input_length, pad=pad, pad_values=pad_values,
                          initial_states=initial_states, allow_small_batch=allow_small_batch, world_size=world_size)
