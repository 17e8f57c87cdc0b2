"""The click group and the option sets every command shares (one definition, many commands)."""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any

import click

from batchtool.exec import settings as settings_mod
from batchtool.core.run_settings import ENGINES
from batchtool.core.errors import BatchtoolError, OptionError, UsageError
from batchtool.core.budget import DEFAULT_MAX_RECORD_BYTES
from batchtool.core.run_settings import RunSettings
from batchtool.ops import OPERATIONS
from batchtool.core.errors import flag
from batchtool.io.formats.registry import FORMATS
from batchtool.core.options import Choice, Integer, Value, fields
from batchtool.core.progress import LINE_SECONDS
from batchtool.core.runner import default_threads
from batchtool.exec.settings import (BATCH_FORMAT, RECORD_LIMIT, ROW_FORMAT, CommonSettings, Directory, InputSettings,
                                OutputSettings, Positive, Size, Text, size_text)

if TYPE_CHECKING:
    from batchtool.io.output import OutputOptions

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _usage_line(exc: click.UsageError, path: str) -> click.exceptions.Exit:
    """click's usage error (its usage, hint and message on four lines) as one `error:` line that keeps
    the message, with its suggestion, and points at the command's --help (`path` when click names none)."""
    message = " ".join(exc.format_message().split())
    path = exc.ctx.command_path if exc.ctx is not None else path
    click.echo(f"error: {message} (see '{path} --help')", err=True)
    return click.exceptions.Exit(exc.exit_code)


class Group(click.Group):
    """Turns BatchtoolErrors and click's usage errors into one line on stderr and exit status 2;
    --debug shows the traceback of BatchtoolErrors.

    Signals are the entry point's (batchtool.entry): it sets their handlers before this module loads.
    """

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # the group's own options and arguments
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _usage_line(exc, info_name or "batchtool") from None

    def invoke(self, ctx: click.Context) -> Any:
        debug = ctx.params.get("debug") or os.environ.get("BATCHTOOL_DEBUG") == "1"
        try:  # the command name, the subcommand's options and arguments, and the command itself
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _usage_line(exc, " ".join(filter(None, [ctx.command_path, ctx.invoked_subcommand]))) from None
        except BatchtoolError as exc:
            if debug:
                raise
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)


def column_list(ctx: click.Context | None, param: click.Parameter, values: Any) -> tuple[str, ...]:
    """The columns of a COL[,COL...] option, given repeated, comma-separated or both (`--sequence a,b
    --sequence c`), in order; a name given twice counts once (nothing is lost). The callback of every
    column-list option, also applied to pipeline-file keys (a list or a comma-separated string)."""
    flag = next((o for o in param.opts if o.startswith("--")), param.name)
    texts = (values,) if isinstance(values, str) else values or ()
    names: list[str] = []
    for text in texts:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise click.BadParameter(f"{text!r} has an empty column name (give COL or COL,COL,...)",
                                     ctx=ctx, param=param, param_hint=flag)
        names += parts
    return tuple(dict.fromkeys(names))


def columns_option(*decls: str, **kwargs: Any) -> Callable:
    """A column-list option: repeatable, each value one column or several, comma-separated."""
    return click.option(*decls, multiple=True, callback=column_list, metavar="COL[,COL...]", **kwargs)


class Checked(click.ParamType):
    """A value kind (core/options.py) as a click type: checked as click parses the text, so a bad value
    is a usage error naming the flag; the command gets the parsed value (a size in bytes)."""

    def __init__(self, kind: Value) -> None:
        self.kind = kind
        self.name = (kind.metavar or "text").lower()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        field = param.name if param is not None and param.name else "value"
        try:
            return self.kind.parse(field, self.kind.from_text(field, value))
        except OptionError as exc:
            self.fail(exc.problem if exc.value is None else f"{exc.value}: {exc.problem}", param, ctx)


SIZE = Checked(Size())


def click_type(kind: Value) -> click.ParamType:
    """How click reads a value kind: with its own types where they say the same (choices, ranges, paths), so
    their usage errors and --help stay click's; anything else checked by the kind itself."""
    if isinstance(kind, Choice):
        return click.Choice(list(kind.choices))
    if isinstance(kind, Positive):
        return click.IntRange(min=1)
    if isinstance(kind, Integer):
        return click.INT
    if isinstance(kind, Directory):
        return click.Path(file_okay=False)
    if isinstance(kind, Text):
        return click.STRING
    return Checked(kind)


def declared_option(schema: type, name: str, **settings: Any) -> Callable:
    """The click option of a settings schema's field: its flag (the schema's FLAGS, else the field's), help, value
    kind and default, shown in --help; `settings` are a command's own (its --to help, its --threads default)."""
    f, decl = next((f, decl) for f, decl in fields(schema) if f.name == name)
    made: dict[str, Any] = {"help": decl.help}
    if decl.value.is_flag:
        made["is_flag"] = True
    else:
        made["type"] = click_type(decl.value)
        if f.default is not None:  # shown as the user writes it (a size as 1GB)
            made.update(show_default=True, default=size_text(f.default) if isinstance(decl.value, Size) else f.default)
    made.update(settings)
    dest = made.pop("dest", name)
    return click.option(getattr(schema, "FLAGS", {}).get(name, flag(name)), dest, **made)


def _apply(fn: Callable, options: list[Callable]) -> Callable:
    """click lists a command's options in the order their decorators are written: the last applied first."""
    for option in reversed(options):
        fn = option(fn)
    return fn


def seed_option(fn: Callable) -> Callable:
    return declared_option(CommonSettings, "seed")(fn)


def memory_options(fn: Callable) -> Callable:
    """--memory (in bytes) and --tmp-dir, for commands that reorder through spill files (run settings: make_run;
    --memory also bounds what the command's input decompresses to)."""
    return _apply(fn, [declared_option(CommonSettings, "memory"), declared_option(CommonSettings, "tmp_dir")])


def input_options(fn: Callable) -> Callable:
    """--format, --skip-corrupt and --max-record-bytes (a run setting: make_run), for every command that reads SRC."""
    return _apply(fn, [
        declared_option(InputSettings, "format", dest="input_format"), declared_option(InputSettings, "skip_corrupt"),
        click.option("--max-record-bytes", default=size_text(DEFAULT_MAX_RECORD_BYTES), metavar="SIZE",
                     show_default=True, help="Largest TFRecord record to read: a record header claiming more is an "
                                             "error, before anything is read. Without --memory, also the most one "
                                             "Arrow IPC record batch may take once decompressed."),
    ])


_ENGINE_META = "batchtool.engine"
_STARTED_META = "batchtool.started"


def run_options(fn: Callable) -> Callable:
    """--threads, --progress, --quiet, --engine and --ray-address: how to run, never what to compute.

    They only make the RunSettings (make_run) the command passes to its entry point, which opens
    that engine's executor (engines.executor, the one place an engine is chosen): a command needs
    nothing more than these options to run on Ray.
    """
    @functools.wraps(fn)
    def settled(*args: Any, engine: str, ray_address: str | None, **kwargs: Any) -> Any:
        settings = RunSettings(threads=kwargs["threads"], engine=engine, ray_address=ray_address)
        click.get_current_context().meta.update({_ENGINE_META: settings, _STARTED_META: time.perf_counter()})
        return fn(*args, **kwargs)

    return _apply(settled, [
        declared_option(CommonSettings, "threads", default=default_threads, show_default="cores"),
        declared_option(CommonSettings, "progress"),
        click.option("--quiet", "-q", is_flag=True, help="No summary, and no progress unless --progress is given."),
        click.option("--engine", type=click.Choice(tuple(ENGINES)), default="local", show_default=True,
                     help="Where the work runs: local threads, local processes, or a Ray cluster (needs "
                          "batchtool[ray]); "
                          "output is identical."),
        click.option("--ray-address", metavar="ADDR",
                     help="With --engine ray: connect to this running Ray cluster (default: start a local one "
                          "with --threads CPUs, or use RAY_ADDRESS)."),
    ])


def output_options(fn: Callable | None = None, *, batches: bool | str = False, keyed: bool = False) -> Callable:
    """Batch-shard output options, for every command that writes DST.

    `batches` declares when the command's output is batches: always (True), or when the flag it names
    is given ("--balanced-batches"); without --to such output is BATCH_FORMAT, anything else ROW_FORMAT. A command
    that may write batches takes --key (the column of their example index) unless `keyed`: it has a --key of its own.
    """
    if fn is None:
        return functools.partial(output_options, batches=batches, keyed=keyed)

    @functools.wraps(fn)
    def resolved(*args: Any, output_format: str | None, **kwargs: Any) -> Any:
        command = click.get_current_context().command
        chosen = output_format or command_format(command, lambda flag: kwargs[flag[2:].replace("-", "_")])
        return fn(*args, output_format=chosen, **kwargs)

    shown = (BATCH_FORMAT if batches is True else f"{BATCH_FORMAT} with {batches}, else {ROW_FORMAT}" if batches
             else ROW_FORMAT)
    to = declared_option(OutputSettings, "format", dest="output_format", cls=_ToOption, batches=batches,
                  help="Output format" + (f"; batchtool.load memory-maps {BATCH_FORMAT} batches" if batches else "")
                  + f".  [default: {shown}]")
    key = [declared_option(OutputSettings, "index_key", metavar="COL")] if batches and not keyed else []
    return _apply(resolved, [to, *(declared_option(OutputSettings, f.name) for f, _ in fields(OutputSettings)[1:]
                                   if f.name != "index_key"), *key])


class _ToOption(click.Option):
    """--to, carrying its command's `batches` declaration (see output_options) for command_format."""

    def __init__(self, *args: Any, batches: bool | str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches = batches


def command_format(command: click.Command | None, given: Callable[[str], Any]) -> str:
    """What `command` writes without --to (settings.default_format from its output_options declaration;
    `given(flag)` is the value of a flag of it)."""
    batches = next((p.batches for p in command.params if isinstance(p, _ToOption)), False) if command else False
    return settings_mod.default_format(batches, given)


def make_output(kwargs: dict[str, Any]) -> OutputOptions:
    """Pop the output options out of a command's kwargs (output_options has chosen the format; --key only where the
    command has it as an output option)."""
    given = {f.name: kwargs.pop("output_format" if f.name == "format" else f.name) for f, _ in fields(OutputSettings)
             if f.name != "index_key"}
    given["index_key"] = kwargs.pop("index_key", None)
    return OutputSettings(**given).options(given["format"])


def make_run(kwargs: dict[str, Any]) -> RunSettings:
    """Pop --threads, --progress and --quiet, and (where the command has them) --memory, --tmp-dir and --max-record-bytes; the
    engine comes from run_options."""
    ctx = click.get_current_context(silent=True)
    chosen = ctx.meta.get(_ENGINE_META, RunSettings()) if ctx is not None else RunSettings()
    memory = kwargs.pop("memory", None)
    limit = kwargs.pop("max_record_bytes", None)
    return RunSettings(threads=kwargs.pop("threads"), quiet=kwargs.pop("quiet"), progress=kwargs.pop("progress"),
                       progress_seconds=progress_seconds(), engine=chosen.engine,
                       ray_address=chosen.ray_address, memory=None if memory is None else parse_memory(memory),
                       tmp_dir=kwargs.pop("tmp_dir", None),
                       max_record_bytes=DEFAULT_MAX_RECORD_BYTES if limit is None
                       else RECORD_LIMIT.parse("max_record_bytes", limit))


PROGRESS_SECONDS = "BATCHTOOL_PROGRESS_SECONDS"
"""The environment variable of the seconds between two --progress lines (default progress.LINE_SECONDS)."""


def progress_seconds() -> float:
    """The seconds between two --progress lines: $BATCHTOOL_PROGRESS_SECONDS, else the default."""
    text = os.environ.get(PROGRESS_SECONDS)
    if text is None:
        return LINE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(f"{PROGRESS_SECONDS}={text}: expected a number of seconds above 0 (e.g. 5, 0.5)")
    return seconds


def parse_memory(text: str) -> int:
    """--memory's text as bytes, read by its declaration's kind of value (settings.Size)."""
    declared_kind = next(decl.value for f, decl in fields(CommonSettings) if f.name == "memory")
    return declared_kind.parse("memory", text)


def summary(result_line: str, quiet: bool) -> None:
    """Print a line of a command's result (report() prints the summary every writing command ends with)."""
    if not quiet:
        click.echo(result_line, err=True)


def manuals() -> dict[str, Traversable]:
    """Topic -> its Markdown file: the repository's docs/*.md, shipped as batchtool/docs/ package data."""
    files = sorted((f for f in (resources.files("batchtool") / "docs").iterdir() if f.name.endswith(".md")),
                   key=lambda f: f.name)
    return {f.name[:-len(".md")]: f for f in files}


def report(manifest: dict[str, Any], dst: str, quiet: bool, batches: bool) -> None:
    """How every writing command ends, `run` included, from DST's manifest: what each step's operation says of
    it (Operation.said: its warnings even with --quiet; for `run` only those, naming the stage), then what each
    step did (rows in and out, what it dropped or duplicated, its own numbers) and one line of what was
    written (`batches`: its output is batches, Operation.writes_batches), the time and the peak memory."""
    stats, output, run = manifest["stats"], manifest["output"], manifest["run"]
    stages = stats.get("stages") or [{**stats, "op": manifest["command"], "rows_out": output["rows"]}]
    for stage in stages:
        op = OPERATIONS.get(stage["op"])  # None: convert, which says nothing more
        for line in op.said(stage).lines if op is not None else ():
            if line.startswith("warning: "):
                click.echo(line, err=True)
            elif "stages" not in stats:
                summary(line, quiet)
    if quiet:
        return
    lines = stage_lines(stages, expected=False) if "stages" in stats else [
        f"{stage['op']}: {_count(stage['rows_in'])} rows in, {_count(stage['rows_out'])} out"
        + (f"; {details}" if (details := notes(stage, expected=False)) else "") for stage in stages]
    ctx = click.get_current_context(silent=True)
    started = ctx.meta.get(_STARTED_META) if ctx is not None else None  # the whole command, first passes too
    seconds = run["wall_seconds"] if started is None else time.perf_counter() - started
    lines.append(f"wrote {output['rows']:,} rows{stored_in(output, batches)} to {len(output['files'])} "
                 f"shard(s) in {os.path.abspath(dst)}; {seconds:.1f} s, "
                 f"peak memory {run['peak_rss_bytes'] / 2**20:,.0f} MiB" + skipped_note(stats))
    click.echo("\n".join(lines), err=True)


def stored_in(output: dict[str, Any], batches: bool) -> str:
    """What the rows were written in: ` in 82 batches` for batches; for rows the format's own units (` in 8 row
    groups`: the writer's, nothing a trainer asked for), or nothing where a reader sees none (TFRecord)."""
    unit = "batch" if batches else FORMATS[output["format"]].group
    if unit is None:
        return ""
    n = output["batches"]
    return f" in {n:,} {unit}" + ("" if n == 1 else "es" if unit.endswith("ch") else "s")


def stage_lines(stages: list[dict[str, Any]], expected: bool) -> list[str]:
    """The per-stage table: rows in and out and what each stage reports (or, dry, plans)."""
    rows = [(f"{s['stage']} {s['op']}", _count(s["rows_in"]), _count(s["rows_out"]), notes(s, expected))
            for s in stages]
    header = ("stage", "rows in", "rows out" + (" (planned)" if expected else ""), "")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join([f"{{:<{widths[0]}}}", f"{{:>{widths[1]}}}", f"{{:>{widths[2]}}}", "{}"])
    return [line.format(*header).rstrip(), *(line.format(*r).rstrip() for r in rows)]


def notes(stage: dict[str, Any], expected: bool) -> str:
    """One line of the numbers that matter for the stage's operation: those its statistics have of the ones any op
    may report, then the op's own words (Said.note)."""
    parts = []
    per_class = stage.get("class_targets" if expected else "class_counts_after")
    if per_class:
        parts.append("per class " + "/".join(f"{n:,}" for n in per_class.values()))
    if expected and "expected_rows" in stage:
        parts.append(f"about {stage['expected_rows']:,} rows")
    dropped = stage.get("examples_dropped")
    if isinstance(dropped, dict):  # bucket: by reason
        reasons = ", ".join(f"{n:,} {why}" for why, n in dropped.items() if n)
        dropped = f"{sum(dropped.values()):,} dropped ({reasons})" if reasons else None
    elif dropped:
        dropped = f"{dropped:,} dropped"
    if dropped:
        parts.append(dropped)
    if stage.get("examples_duplicated"):
        parts.append(f"{stage['examples_duplicated']:,} duplicated")
    if stage.get("examples_split"):
        parts.append(f"{stage['examples_split']:,} split into pieces")
    if stage.get("segments") is not None:
        parts.append(f"{stage['segments']:,} segments" + (f" of {stage['examples']:,} examples"
                                                           if stage.get("examples") is not None else ""))
    if stage.get("empty_slot_fraction"):
        parts.append(f"empty slots {100 * stage['empty_slot_fraction']:.2f}%")
    if stage.get("batches") is not None:
        parts.append(f"{stage['batches']:,} batches" + (f" in {stage['num_buckets']} buckets"
                                                          if stage.get("num_buckets") else ""))
    if stage.get("rows_lower_bound") is not None:
        parts.append(f"{stage['rows']:,} packed rows (lower bound {stage['rows_lower_bound']:,}), packing efficiency "
                     f"{100 * (stage['packing_efficiency'] or 0):.2f}%")
    if stage.get("boundaries") and "grid" not in stage:  # a grid's: on bucket's own line (ops.bucket.report)
        parts.append("boundaries " + ",".join(map(str, stage["boundaries"])))
    efficiency = stage.get("padding_efficiency")
    if efficiency is not None:
        parts.append(f"padding efficiency {100 * efficiency:.1f}%" + (" (expected)" if expected else ""))
    op = OPERATIONS.get(stage["op"])
    return ", ".join([*parts, *(op.said(stage).note if op is not None else ())])


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def skipped_note(stats: dict[str, Any]) -> str:
    """What --skip-corrupt cost, exactly, for the end of the summary line ('' when nothing was skipped)."""
    if "corrupt_records_skipped" not in stats:
        return ""
    records, size = stats["corrupt_records_skipped"], stats.get("corrupt_bytes_skipped", 0)
    return f" ({records:,} corrupt record{'s' * (records != 1)}, {size:,} bytes skipped)"


def command(name: str, example: str) -> Callable:
    """A subcommand (batchtool.cli's group finds it by name) whose help ends with an example, as every command's
    must, and names its manual."""
    manual = f"\nManual: batchtool docs {name}\n" if name in manuals() else ""
    def wrap(fn: Callable) -> Callable:
        doc = inspect.cleandoc(fn.__doc__ or "") + f"\n\n\b\nExample:\n  {example}\n{manual}"
        fn.__doc__ = doc
        return click.command(name, context_settings=CONTEXT)(functools.wraps(fn)(fn))
    return wrap
