"""`shuffle`: parses its options and calls one library function (stratify's and resample's commands are generated
from their definitions, in cli/ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import click

from batchtool.cli.common import (command, input_options, make_output, make_run, memory_options, output_options,
                                  parse_size, report, run_options, seed_option)
from batchtool.ops.shuffle import ShuffleOptions, shuffle


def batch_options(fn: Callable) -> Callable:
    fn = click.option("--drop-remainder", is_flag=True,
                      help="Drop the final batch if it is smaller than --batch-size.")(fn)
    fn = click.option("--batch-size", type=int, default=None,
                      help="Write batches (row groups) of this many rows.")(fn)
    return fn


@command("shuffle", "batchtool shuffle sample_data/parquet /tmp/shuffled --memory 256MB --seed 1")
@click.argument("src")
@click.argument("dst")
@batch_options
@click.option("--buffer", type=int, help="Buffered shuffle (shuffle_batch's capacity) instead of a global one.")
@click.option("--min-after-dequeue", type=int,
              help="shuffle_batch's min_after_dequeue; alone it sets the buffer to it plus the batch size.")
@seed_option
@memory_options
@input_options
@output_options
@run_options
def shuffle_cmd(src: str, dst: str, seed: int, input_format: str | None, skip_corrupt: bool, **kwargs) -> None:
    """Shuffle SRC into DST: an exact seeded permutation in bounded memory, or the buffered shuffle of
    tf.compat.v1.train.shuffle_batch."""
    output, run = make_output(kwargs), make_run(kwargs)
    options = shuffle_options(**kwargs)
    result = shuffle(src, dst, options, output, run, seed=seed, format=input_format, skip_corrupt=skip_corrupt)
    report(result.manifest, dst, run.quiet)


def shuffle_options(*, batch_size: int | None, drop_remainder: bool, buffer: int | None,
                    min_after_dequeue: int | None, memory: str, tmp_dir: str | None) -> ShuffleOptions:
    """shuffle's options from its flags' values (shared with pipeline files)."""
    return ShuffleOptions(memory=parse_size(memory), tmp_dir=tmp_dir, batch_size=batch_size,
                          drop_remainder=drop_remainder, buffer=buffer, min_after_dequeue=min_after_dequeue)
