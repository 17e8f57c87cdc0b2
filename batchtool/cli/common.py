"""The click group and the option sets every command shares (one definition, many commands)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import click

import batchtool
from batchtool.engines import ENGINES, engine_scope
from batchtool.errors import BatchtoolError, UsageError
from batchtool import formats
from batchtool.formats import tfrecord
from batchtool.job import RunSettings
from batchtool.output import CASTS, DEFAULT_SHARD_BYTES, OutputOptions
from batchtool.runner import default_threads

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """Turns BatchtoolErrors into one line on stderr and exit status 2; --debug shows the traceback.

    Signals are the entry point's (batchtool.entry): it sets their handlers before this module loads.
    """

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug") or os.environ.get("BATCHTOOL_DEBUG") == "1"
        try:
            return super().invoke(ctx)
        except BatchtoolError as exc:
            if debug:
                raise
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings=CONTEXT)
@click.version_option(batchtool.__version__, "--version", prog_name="batchtool")
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
def cli(debug: bool) -> None:
    """Prepare sequence datasets for training, offline.

    Reads Parquet and TFRecord shards, resamples, buckets and segments them, and
    writes pre-batched shards plus a manifest of what it did.

    \b
    Example:
      batchtool inspect sample_data/parquet --label label
    """


def parse_size(text: str | None) -> int | None:
    """'256MB', '1GiB', '1000000' -> bytes."""
    if text is None:
        return None
    units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}
    s = text.strip().upper()
    digits = s.rstrip("KMGTIB")
    try:
        value = float(digits)
        return int(value * units[s[len(digits):]])
    except (ValueError, KeyError):
        raise click.BadParameter(f"{text!r} is not a size (e.g. 256MB, 1GB, 1000000)") from None


def input_options(fn: Callable) -> Callable:
    """--format, --skip-corrupt and --max-record-bytes, for every command that reads SRC.

    --max-record-bytes is applied around the whole command (tfrecord.record_limit), so every
    reader the command opens obeys it without each command passing it on.
    """
    @functools.wraps(fn)
    def limited(*args: Any, max_record_bytes: str, **kwargs: Any) -> Any:
        try:
            limit = parse_size(max_record_bytes)
        except click.BadParameter:
            limit = 0
        if limit < 1:
            raise UsageError(f"--max-record-bytes {max_record_bytes!r}: expected a size of at least 1 byte "
                             "(e.g. 64MB, 1GB)")
        with tfrecord.record_limit(limit):
            return fn(*args, **kwargs)

    options = [
        click.option("--max-record-bytes", default=f"{tfrecord.DEFAULT_MAX_RECORD_BYTES >> 20}MB", metavar="SIZE",
                     show_default=True, help="Largest TFRecord record to read: a record header claiming more is an "
                                             "error, before anything is read."),
        click.option("--skip-corrupt", is_flag=True,
                     help="Skip damaged TFRecord records instead of stopping (a bad CRC; lost framing, up to the "
                          "next record whose CRCs check out; a cut-short last record), counting the records and "
                          "bytes skipped in the manifest."),
        click.option("--format", "input_format", type=click.Choice(formats.NAMES),
                     help="Input format (default: from the file names)."),
    ]
    for option in options:
        limited = option(limited)
    return limited


_ENGINE_META = "batchtool.engine"


def run_options(fn: Callable) -> Callable:
    """--threads, --quiet, --engine and --ray-address: how to run, never what to compute.

    The whole command runs on the chosen engine (make_run passes it on in RunSettings), so a
    command needs nothing more than these options to run on Ray.
    """
    @functools.wraps(fn)
    def on_engine(*args: Any, engine: str, ray_address: str | None, **kwargs: Any) -> Any:
        settings = RunSettings(threads=kwargs["threads"], engine=engine, ray_address=ray_address)
        click.get_current_context().meta[_ENGINE_META] = settings
        with engine_scope(settings):
            return fn(*args, **kwargs)

    options = [
        click.option("--ray-address", metavar="ADDR",
                     help="With --engine ray: connect to this running Ray cluster (default: start a local one "
                          "with --threads CPUs, or use RAY_ADDRESS)."),
        click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
                     help="Where the work runs: local threads, or a Ray cluster (needs batchtool[ray]); "
                          "output is identical."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bars or summary."),
        click.option("--threads", type=click.IntRange(min=1), default=default_threads, show_default="cores",
                     help="Worker threads; output is identical for any value."),
    ]
    for option in options:
        on_engine = option(on_engine)
    return on_engine


def output_options(fn: Callable) -> Callable:
    """Batch-shard output options, for every command that writes DST."""
    options = [
        click.option("--overwrite", is_flag=True, help="Replace DST if it exists."),
        click.option("--cast", type=click.Choice(list(CASTS)), default=None,
                     help="TFRecord output: round float64 columns to float32 (tf.train.FloatList holds only float32; "
                          "without this they are refused). The manifest lists the columns cast."),
        click.option("--tfrecord-kind", type=click.Choice(["sequence_example", "example"]),
                     default="sequence_example", show_default=True,
                     help="Payload of TFRecord output."),
        click.option("--shard-bytes", default=None, metavar="SIZE",
                     help=f"Start a new output shard past this size (default {DEFAULT_SHARD_BYTES >> 20}MB)."),
        click.option("--shard-rows", type=click.IntRange(min=1), default=None,
                     help="Start a new output shard past this many rows."),
        click.option("--compression", default=None,
                     help="Parquet codec (zstd default, snappy, gzip, lz4, brotli, none), TFRecord gzip/none, or "
                          "Arrow lz4/zstd/none (default none)."),
        click.option("--to", "output_format", type=click.Choice(formats.NAMES), default="parquet",
                     show_default=True, help="Output format."),
    ]
    for option in options:
        fn = option(fn)
    return fn


def make_output(kwargs: dict[str, Any]) -> OutputOptions:
    """Pop the output options out of a command's kwargs."""
    return OutputOptions(format=kwargs.pop("output_format"), compression=kwargs.pop("compression"),
                         shard_rows=kwargs.pop("shard_rows"),
                         shard_bytes=parse_size(kwargs.pop("shard_bytes")) or DEFAULT_SHARD_BYTES,
                         tfrecord_kind=kwargs.pop("tfrecord_kind"), overwrite=kwargs.pop("overwrite"),
                         cast=(cast,) if (cast := kwargs.pop("cast")) else ())


def make_run(kwargs: dict[str, Any]) -> RunSettings:
    """Pop --threads and --quiet; the engine comes from run_options."""
    ctx = click.get_current_context(silent=True)
    chosen = ctx.meta.get(_ENGINE_META, RunSettings()) if ctx is not None else RunSettings()
    return RunSettings(threads=kwargs.pop("threads"), quiet=kwargs.pop("quiet"), engine=chosen.engine,
                       ray_address=chosen.ray_address)


def summary(result_line: str, quiet: bool, stats: dict[str, Any] | None = None) -> None:
    """Print a command's result line; with the manifest's stats, it also says what was skipped."""
    if stats and "corrupt_records_skipped" in stats:
        records, size = stats["corrupt_records_skipped"], stats["corrupt_bytes_skipped"]
        result_line += f" ({records:,} corrupt record{'s' * (records != 1)}, {size:,} bytes skipped)"
    if not quiet:
        click.echo(result_line, err=True)


def command(name: str, example: str) -> Callable:
    """A subcommand whose help ends with an example, as every command's must."""
    def wrap(fn: Callable) -> Callable:
        doc = inspect.cleandoc(fn.__doc__ or "") + f"\n\n\b\nExample:\n  {example}\n"
        fn.__doc__ = doc
        return cli.command(name, context_settings=CONTEXT)(functools.wraps(fn)(fn))
    return wrap
