"""`bucket`: the command line of batchtool.ops.bucket."""

from __future__ import annotations

from typing import Any

import click

from batchtool.cli.common import (
    SIZE,
    columns_option,
    command,
    input_options,
    make_output,
    make_run,
    output_options,
    parse_size,
    report,
    run_options,
    summary,
)
from batchtool.errors import UsageError
from batchtool.ops.bucket import COSTS, ORDERS, BucketOptions, bucket
from batchtool.ops.stratify import parse_target


def int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """'64,128,256' -> (64, 128, 256); anything else is a UsageError naming the flag."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers, e.g. 64,128,256") from None


@command("bucket", "batchtool bucket sample_data/parquet /tmp/bucketed --length tokens --auto-buckets 8 "
                   "--batch-size 32")
@click.argument("src")
@click.argument("dst")
@click.option("--length", help="Length to bucket by: an integer column, or a list column's steps "
                               "(default: the first sequence column).")
@columns_option("--sequence", "sequences",
              help="A sequence (list) column to pad; repeat for several, which must agree in length "
                   "(default: every list column).")
@click.option("--boundaries", help="Bucket edges b0,b1,...: buckets < b0, [b_i, b_i+1), >= b_last.")
@click.option("--auto-buckets", type=int, metavar="K",
              help="Choose K buckets from the length distribution to minimise padding.")
@click.option("--bucket-column", help="Integer column giving each example's bucket (with --num-buckets).")
@click.option("--num-buckets", type=int, help="Buckets of --bucket-column: values in [0, N).")
@click.option("--batch-size", metavar="B[,B...]", help="Rows per batch, or one size per bucket.")
@click.option("--max-tokens", type=int, metavar="T",
              help="Instead of --batch-size: at most T padded elements (rows x padded length) per batch.")
@click.option("--max-rows", type=int, help="With --max-tokens: also at most this many rows per batch.")
@click.option("--cost", type=click.Choice(COSTS), default="linear", show_default=True,
              help="With --max-tokens, what a batch costs: rows x padded length (linear), or rows x padded "
                   "length squared (quadratic, as attention costs), so short buckets get more rows.")
@click.option("--drop-oversize", is_flag=True,
              help="Drop (and count) examples that exceed --max-tokens alone, instead of stopping.")
@click.option("--pad-to-boundary", is_flag=True,
              help="Pad to the longest length the bucket admits (boundary - 1), not the batch's longest.")
@click.option("--pad-value", "pad_values", multiple=True, metavar="COL=V",
              help="Pad value of a sequence column (default 0, '' for strings); repeatable.")
@click.option("--mask", is_flag=True, help="Add a 'mask' list<bool> column, true on real steps.")
@click.option("--output-column", "output_columns", multiple=True, metavar="OUT=NAME",
              help="Name an output column (batch, bucket, length or mask) otherwise, when the input already "
                   "has a column of that name; repeatable.")
@click.option("--keep", metavar="COL", help="Boolean column: only rows where it is true are bucketed.")
@click.option("--drop-remainder", is_flag=True, help="Drop (and count) each bucket's last, partial batch.")
@click.option("--balance", metavar="LABEL_COL",
              help="Every full batch of every bucket holds each class's exact share of the batch "
                   "(as tf.contrib.training.stratified_sample, but exact per batch); rows no balanced "
                   "batch can take are dropped and counted.")
@click.option("--target", help="With --balance: class proportions P0,P1,..., CLASS=PROB pairs, or uniform "
                                "(default).")
@click.option("--oversample", is_flag=True,
              help="With --balance: repeat rarer classes (keyed, deterministic) instead of dropping rows of "
                   "the common ones.")
@click.option("--order", type=click.Choice(ORDERS), default="shuffle", show_default=True,
              help="shuffle: seeded random order within buckets and across batches; "
                   "sorted: ascending length, buckets in order (for inference).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--memory", type=SIZE, default="1GB", show_default=True, metavar="SIZE",
              help="Memory for holding buckets; larger buckets spill to temporary files.")
@click.option("--tmp-dir", help="Directory for spill files (default: the system temp directory).")
@input_options
@output_options(batches=True)
@run_options
def bucket_cmd(src: str, dst: str, seed: int, input_format: str | None, skip_corrupt: bool, **kwargs: Any) -> None:
    """Group examples by length into padded batches (tf.contrib.training.bucket / bucket_by_sequence_length).

    Every batch holds examples of one bucket, padded to one length; batches from all
    buckets are written in a seeded random order. DST gets batch, bucket and length
    columns, and a manifest with padding efficiency per bucket.
    """
    output = make_output(kwargs)
    run = make_run(kwargs)
    options = bucket_options(**kwargs)
    result = bucket(src, dst, options, output, run, seed=seed, format=input_format, skip_corrupt=skip_corrupt)
    stats = result.manifest["stats"]
    auto = stats.get("auto_buckets")
    if auto:
        summary(f"auto-buckets: boundaries {','.join(map(str, stats['boundaries'])) or '(one bucket)'}; "
                f"expected padding efficiency {percent(auto['expected_padding_efficiency'])} "
                f"({auto['k']} quantile buckets: {percent(auto['quantile_expected_padding_efficiency'])})",
                run.quiet)
    if "balance" in stats:
        unbalanced = stats["examples_dropped"]["unbalanced"]
        if unbalanced > stats["rows_in"] / 2:
            click.echo(f"warning: --balance dropped {unbalanced / stats['rows_in']:.1%} of the examples "
                       f"({unbalanced:,} of {stats['rows_in']:,}: no balanced batch could take them); "
                       "--oversample repeats rarer classes instead", err=True)
        summary(balance_line(stats["balance"]), run.quiet)
    report(result.manifest, dst, run.quiet)


def bucket_options(*, length: str | None, sequences: tuple[str, ...], boundaries: str | None,
                   auto_buckets: int | None, bucket_column: str | None, num_buckets: int | None,
                   batch_size: str | None, max_tokens: int | None, max_rows: int | None, drop_oversize: bool,
                   pad_to_boundary: bool, pad_values: tuple[str, ...], mask: bool, keep: str | None,
                   drop_remainder: bool, order: str, memory: str, tmp_dir: str | None, cost: str = "linear",
                   balance: str | None = None, target: str | None = None, oversample: bool = False,
                   output_columns: tuple[str, ...] | str = ()) -> BucketOptions:
    """bucket's options from its flags' values (shared with pipeline files, whose keys are the flags)."""
    return BucketOptions(
        length=length, sequences=sequences, boundaries=int_list("--boundaries", boundaries),
        auto_buckets=auto_buckets, bucket_column=bucket_column, num_buckets=num_buckets,
        batch_size=int_list("--batch-size", batch_size), max_tokens=max_tokens, max_rows=max_rows,
        drop_oversize=drop_oversize, pad_to_boundary=pad_to_boundary, pad_values=pad_values, mask=mask,
        keep=keep, drop_remainder=drop_remainder, order=order, memory=parse_size(memory), tmp_dir=tmp_dir,
        cost=cost, balance=balance, target=parse_target(target) if target is not None else "uniform",
        oversample=oversample, output_columns=pairs("--output-column", output_columns))


def pairs(flag: str, values: tuple[str, ...] | str) -> tuple[tuple[str, str], ...]:
    """OUT=NAME values (repeated, or comma-separated) -> ((OUT, NAME), ...)."""
    items = [part.strip() for value in ([values] if isinstance(values, str) else values)
             for part in value.split(",") if part.strip()]
    out = []
    for item in items:
        role, sep, name = item.partition("=")
        if not sep:
            raise UsageError(f"{flag} {item!r}: expected OUT=NAME, e.g. length=n_steps")
        out.append((role.strip(), name.strip()))
    return tuple(out)


def balance_line(balance: dict[str, Any]) -> str:
    """--balance: rows per class in and out, and each class's smallest and largest share of a batch."""
    shares = ", ".join(f"{c}: {percent(lo)}-{percent(hi)}" for c, (lo, hi) in
                       enumerate(zip(balance["batch_share_min"], balance["batch_share_max"])))
    rows = ", ".join(f"{c}: {i:,}->{o:,}" for c, (i, o) in
                     enumerate(zip(balance["class_rows_in"], balance["class_rows_out"])))
    repeated = f"; {balance['examples_repeated']:,} repeated" if balance["examples_repeated"] else ""
    return f"balanced by {balance['label']}: rows per class {rows}{repeated}; share of each batch {shares}"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
