"""`run`: execute a pipeline file (stages chained in one streaming run) and report per stage."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from batchtool.cli.common import command, declared_option, make_run, stage_lines, report, run_options
from batchtool.exec.settings import CommonSettings, OutputSettings


@command("run", "batchtool run sample_data/pipeline.toml")
@click.argument("pipeline", metavar="PIPELINE.toml")
@click.option("--dry-run", is_flag=True,
              help="Run the first passes only and print what each stage would produce; write nothing.")
@declared_option(CommonSettings, "tmp_dir",
                 help="Directory for spill files (instead of the file's tmp-dir or the system's).")
@declared_option(OutputSettings, "overwrite", help="Replace the [output] path if it exists (as overwrite = true).")
@run_options
def run_cmd(pipeline: str, dry_run: bool, tmp_dir: str | None, overwrite: bool, **kwargs: Any) -> None:
    """Run the stages of PIPELINE.toml (stratify, resample, shuffle, bucket, pack, segment, filter,
    select, rename) in one streaming, multithreaded run, with the same output as running them one
    by one through their commands with the same seed.

    Stage keys are the commands' flags without '--' (see `batchtool docs run`). --threads defaults to the
    file's `threads`, else the number of cores; --progress to the file's `progress`.
    """
    from batchtool.pipeline import config as pipeline_config  # when it runs: --help needs none of the pipeline
    from batchtool.pipeline import execute

    config = pipeline_config.load(pipeline, tmp_dir=tmp_dir, overwrite=overwrite)
    ctx = click.get_current_context()
    if config.threads is not None and ctx.get_parameter_source("threads") is not ParameterSource.COMMANDLINE:
        kwargs["threads"] = config.threads
    if kwargs["progress"] is None and not kwargs["quiet"]:
        kwargs["progress"] = config.progress
    run = make_run(kwargs)
    result = execute.run_pipeline(config, run, dry_run=dry_run)
    if dry_run:
        click.echo("\n".join(stage_lines(result.stages, expected=True)))
        click.echo(f"(dry run: first passes only, nothing written; {result.wall_seconds:.1f} s)")
        return
    assert result.manifest is not None
    report(result.manifest, config.output_path, run.quiet, config.stages[-1].batching)
