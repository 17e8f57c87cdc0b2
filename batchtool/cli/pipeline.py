"""`run`: execute a pipeline file (stages chained in one streaming run) and report per stage."""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from batchtool.cli.common import command, make_run, run_options, summary
from batchtool.pipeline import config as pipeline_config
from batchtool.pipeline import execute


@command("run", "batchtool run sample_data/pipeline.toml")
@click.argument("pipeline", metavar="PIPELINE.toml")
@click.option("--dry-run", is_flag=True,
              help="Run the first passes only and print what each stage would produce; write nothing.")
@click.option("--tmp-dir", type=click.Path(file_okay=False),
              help="Directory for spill files (instead of the file's tmp-dir or the system's).")
@click.option("--overwrite", is_flag=True, help="Replace the [output] path if it exists (as overwrite = true).")
@run_options
def run_cmd(pipeline: str, dry_run: bool, tmp_dir: str | None, overwrite: bool, **kwargs: Any) -> None:
    """Run the stages of PIPELINE.toml (stratify, resample, shuffle, bucket, pack, segment, filter,
    select, rename) in one streaming, multithreaded run, with the same output as running them one
    by one through their commands with the same seed.

    Stage keys are the commands' flags without '--' (see `batchtool docs run`). --threads defaults to the
    file's `threads`, else the number of cores.
    """
    config = pipeline_config.load(pipeline, tmp_dir=tmp_dir, overwrite=overwrite)
    ctx = click.get_current_context()
    if config.threads is not None and ctx.get_parameter_source("threads") is not ParameterSource.COMMANDLINE:
        kwargs["threads"] = config.threads
    run = make_run(kwargs)
    result = execute.run_pipeline(config, run, dry_run=dry_run)
    if dry_run:
        click.echo("\n".join(render(result.stages, expected=True)))
        click.echo(f"(dry run: first passes only, nothing written; {result.wall_seconds:.1f} s)")
        return
    assert result.manifest is not None
    output = result.manifest["output"]
    summary("\n".join([*render(result.stages, expected=False),
                       (f"wrote {output['rows']:,} rows in {output['batches']:,} row groups to "
                       f"{len(output['files'])} shard(s) in {os.path.abspath(config.output_path)}; "
                       f"{result.wall_seconds:.1f} s, peak memory {result.peak_rss_bytes / 2**20:,.0f} MiB")]),
            run.quiet, result.manifest["stats"])


def render(stages: list[dict[str, Any]], expected: bool) -> list[str]:
    """The per-stage table: rows in and out and what each stage reports (or, dry, plans)."""
    rows = [(f"{s['stage']} {s['op']}", _count(s["rows_in"]), _count(s["rows_out"]), notes(s, expected))
            for s in stages]
    header = ("stage", "rows in", "rows out" + (" (planned)" if expected else ""), "")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join([f"{{:<{widths[0]}}}", f"{{:>{widths[1]}}}", f"{{:>{widths[2]}}}", "{}"])
    return [line.format(*header).rstrip(), *(line.format(*r).rstrip() for r in rows)]


def notes(stage: dict[str, Any], expected: bool) -> str:
    """One line of the numbers that matter for the stage's operation."""
    parts = []
    per_class = stage.get("class_targets" if expected else "class_counts_after")
    if per_class:
        parts.append("per class " + "/".join(f"{n:,}" for n in per_class.values()))
    if expected and "expected_rows" in stage:
        parts.append(f"about {stage['expected_rows']:,} rows")
    dropped = stage.get("examples_dropped")
    if isinstance(dropped, dict):
        dropped = sum(dropped.values())
    if stage.get("examples_duplicated"):
        parts.append(f"{stage['examples_duplicated']:,} duplicated")
    if dropped and stage["op"] != "stratify":
        parts.append(f"{dropped:,} dropped")
    if stage.get("segments") is not None:
        parts.append(f"{stage['segments']:,} segments")
    if stage.get("batches") is not None:
        parts.append(f"{stage['batches']:,} batches" + (f" in {stage['num_buckets']} buckets"
                                                          if stage.get("num_buckets") else ""))
    if stage.get("rows_lower_bound") is not None:
        parts.append(f"{stage['rows']:,} packed rows (lower bound {stage['rows_lower_bound']:,}), packing efficiency "
                     f"{100 * (stage['packing_efficiency'] or 0):.2f}%")
    if stage.get("boundaries"):
        parts.append("boundaries " + ",".join(map(str, stage["boundaries"])))
    efficiency = stage.get("padding_efficiency")
    if efficiency is not None:
        parts.append(f"padding efficiency {100 * efficiency:.1f}%" + (" (expected)" if expected else ""))
    if stage["op"] == "shuffle" and "mode" in stage:
        parts.append(f"{stage['mode']} shuffle")
    return ", ".join(parts)


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
