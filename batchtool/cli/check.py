"""`check`: dataset rules for CI; exit 0 when all pass, 1 when one fails, 2 on bad usage or unreadable input."""

from __future__ import annotations

import click

from batchtool.check import (CheckOptions, RuleSet, check, junit_xml, load_rules, render_text, rules_from_flags,
                             to_json)
from batchtool.check.report import write
from batchtool.cli.common import command, input_options, make_run, parse_size, run_options


def _columns(text: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip()) if text else ()


def _floats(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(p) for p in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers") from None


@command("check", "batchtool check sample_data/parquet --rules sample_data/rules.toml --junit check.xml")
@click.argument("src")
@click.option("--rules", "rules_file", metavar="RULES.toml", help="Rules file (see docs/check.md); flags add rules.")
@click.option("--label", metavar="COL", help="Label column of --num-classes and --target (default: label).")
@click.option("--num-classes", type=int, help="Rule: every label is in [0, N).")
@click.option("--target", callback=_floats, metavar="P0,P1,...",
              help="Rule: class proportions within --tolerance of these.")
@click.option("--tolerance", type=float, help="Allowed |proportion - target| for --target (default 0.01).")
@click.option("--min-rows", type=int, help="Rule: at least N rows.")
@click.option("--max-rows", type=int, help="Rule: at most N rows.")
@click.option("--unique", multiple=True, metavar="COL[,COL...]",
              help="Rule: no two rows share this key (repeat the flag for more keys).")
@click.option("--no-nulls", metavar="COL,...", help="Rule: no nulls in these columns.")
@click.option("--length", metavar="COL", help="Column of --min-length/--max-length (default: the first list column).")
@click.option("--min-length", type=int, help="Rule: every row at least this long.")
@click.option("--max-length", type=int, help="Rule: every row at most this long.")
@click.option("--checksums", is_flag=True, help="Rule: files match the sizes and sha256 in DST's manifest.")
@click.option("--crc", is_flag=True, help="Rule: every TFRecord record's CRCs are valid (corrupt ones are counted).")
@click.option("--key", metavar="COL", help="Column shown with offending rows (default: key, if present).")
@click.option("--max-offenders", type=int, help="Offending rows listed per rule (default 5).")
@click.option("--json", "json_file", metavar="FILE", help="Write the result as JSON ('-': to stdout, no table).")
@click.option("--junit", "junit_file", metavar="FILE", help="Write a JUnit XML report (one testcase per rule).")
@click.option("--memory", default="1GB", show_default=True, metavar="SIZE",
              help="Memory for unique-key and duplicate-row hashes before they spill to --tmp-dir.")
@click.option("--tmp-dir", type=click.Path(file_okay=False), help="Where hashes spill (default: system temp).")
@input_options
@run_options
def check_cmd(src: str, rules_file: str | None, label: str | None, num_classes: int | None,
              target: tuple[float, ...] | None, tolerance: float | None, min_rows: int | None, max_rows: int | None,
              unique: tuple[str, ...], no_nulls: str | None, length: str | None, min_length: int | None,
              max_length: int | None, checksums: bool, crc: bool, key: str | None, max_offenders: int | None,
              json_file: str | None, junit_file: str | None, memory: str, tmp_dir: str | None,
              input_format: str | None, skip_corrupt: bool, **kwargs) -> None:
    """Check SRC against rules and print a table of them: PASS/FAIL, the measured value and the bound.

    Rules come from --rules RULES.toml and from the flags below (schema, nulls, NaN, label range,
    class proportions, rows per class, lengths, sequence agreement, unique keys, duplicate rows,
    row counts, padding efficiency, manifest checksums, TFRecord CRCs). One streaming pass reads
    only the columns the rules need. Exit status: 0 all pass, 1 a rule fails, 2 bad usage or
    unreadable input.
    """
    run = make_run(kwargs)
    flags = rules_from_flags(label=label, num_classes=num_classes, target=target, tolerance=tolerance,
                             min_rows=min_rows, max_rows=max_rows, unique=[_columns(u) for u in unique],
                             no_nulls=_columns(no_nulls), length=length, min_length=min_length,
                             max_length=max_length, checksums=checksums, crc=crc)
    rules = (load_rules(rules_file) if rules_file else RuleSet()) + flags
    options = CheckOptions(key=key, max_offenders=max_offenders, memory=parse_size(memory), tmp_dir=tmp_dir,
                           format=input_format, skip_corrupt=skip_corrupt)
    result = check(src, rules, options, run)
    if json_file == "-":
        click.echo(to_json(result), nl=False)
    else:
        click.echo(render_text(result))
        if json_file:
            write(json_file, to_json(result), "--json")
    if junit_file:
        write(junit_file, junit_xml(result), "--junit")
    click.get_current_context().exit(result.exit_code)
