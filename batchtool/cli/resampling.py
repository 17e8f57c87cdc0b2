"""`stratify` and `shuffle`: each parses its options and calls one library function (resample's command is
generated from its operation definition, see cli/ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import click

from batchtool.cli.common import (SIZE, command, input_options, make_output, make_run, output_options, parse_size,
                                  report, run_options)
from batchtool.ops.shuffle import ShuffleOptions, shuffle
from batchtool.ops.stratify import MODES, StratifyOptions, parse_probs, parse_target
from batchtool.stratify_writer import stratify


def seed_option(fn: Callable) -> Callable:
    return click.option("--seed", type=int, default=0, show_default=True,
                        help="Seed of every random decision (same seed, same output bytes).")(fn)


def memory_options(fn: Callable) -> Callable:
    """--memory and --tmp-dir, for commands that reorder through spill files."""
    fn = click.option("--tmp-dir", type=click.Path(file_okay=False),
                      help="Directory for temporary spill files (default: the system's).")(fn)
    fn = click.option("--memory", type=SIZE, default="1GB", show_default=True, metavar="SIZE",
                      help="Memory for reordering; more data than this spills to --tmp-dir.")(fn)
    return fn


def batch_options(fn: Callable) -> Callable:
    fn = click.option("--drop-remainder", is_flag=True,
                      help="Drop the final batch if it is smaller than --batch-size.")(fn)
    fn = click.option("--batch-size", type=int, default=None,
                      help="Write batches (row groups) of this many rows.")(fn)
    return fn


@command("stratify", "batchtool stratify sample_data/parquet /tmp/balanced --label label --target uniform")
@click.argument("src")
@click.argument("dst")
@click.option("--label", default="label", show_default=True, help="Integer class column (values in [0, classes)).")
@click.option("--target", required=True, metavar="SPEC",
              help="Target proportions: P0,P1,... or 'uniform' or CLASS=PROB pairs (others get 0).")
@click.option("--mode", type=click.Choice(MODES), default="exact", show_default=True,
              help="exact: floor(M*t_i) examples per class, M = min_i n_i/t_i (n_i: examples); bernoulli: "
                   "per-example acceptance as tf.contrib.training.stratified_sample; "
                   "online: class distribution estimated as the data streams.")
@click.option("--init-probs", metavar="P0,P1,...",
              help="Known class proportions of SRC (--mode bernoulli; default: counted in a first pass).")
@click.option("--num-classes", type=int, help="Number of classes (default: from --target, or the largest label + 1).")
@click.option("--replacement", is_flag=True, help="Upsample small classes instead of discarding large ones.")
@click.option("--size", type=int, help="Output examples (--replacement: default the input size; exact: at most M).")
@batch_options
@click.option("--balanced-batches", is_flag=True,
              help="Every batch holds its exact share of each class, rows shuffled, batches in random order.")
@seed_option
@memory_options
@input_options
@output_options(batches="--balanced-batches")
@run_options
def stratify_cmd(src: str, dst: str, seed: int, input_format: str | None, skip_corrupt: bool, **kwargs) -> None:
    """Resample SRC to target class proportions (tf.contrib.training.stratified_sample) and write DST."""
    output, run = make_output(kwargs), make_run(kwargs)
    options = stratify_options(**kwargs)
    result = stratify(src, dst, options, output, run, seed=seed, format=input_format, skip_corrupt=skip_corrupt)
    report(result.manifest, dst, run.quiet)


def stratify_options(*, label: str, target: str, mode: str, init_probs: str | None, num_classes: int | None,
                     replacement: bool, size: int | None, batch_size: int | None, drop_remainder: bool,
                     balanced_batches: bool, memory: str, tmp_dir: str | None) -> StratifyOptions:
    """stratify's options from its flags' values (shared with pipeline files, whose keys are the flags)."""
    return StratifyOptions(
        label=label, target=parse_target(target), mode=mode,
        init_probs=parse_probs(init_probs, "--init-probs") if init_probs is not None else None,
        num_classes=num_classes, replacement=replacement, size=size, batch_size=batch_size,
        balanced_batches=balanced_batches, drop_remainder=drop_remainder, memory=parse_size(memory), tmp_dir=tmp_dir)


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
