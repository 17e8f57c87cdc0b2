"""`check`: dataset rules for CI; exit 0 when all pass, 1 when one fails, 2 on bad usage or unreadable input."""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

import click

from batchtool.cli.common import (SIZE, column_list, columns_option, command, input_options, make_run,
                                  run_options)
from batchtool.core.errors import UsageError


def _keys(ctx: click.Context, param: click.Parameter, texts: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """--unique: each flag is one key, of one column or several."""
    return tuple(column_list(ctx, param, text) for text in texts)


def _tolerances(ctx: click.Context, param: click.Parameter,
                texts: tuple[str, ...]) -> tuple[float | None, dict[str, float]]:
    """A bare number (the --target tolerance) and KEY=X pairs (the drift rules' tolerances)."""
    bare: float | None = None
    keyed: dict[str, float] = {}
    for text in texts:
        key, _, number = text.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            raise UsageError(f"--tolerance {text}: not a number or KEY=NUMBER (e.g. proportions=0.02)") from None
        if not value >= 0:
            raise UsageError(f"--tolerance {text}: a tolerance must be a number >= 0")
        if not key and bare is not None:
            raise UsageError(f"--tolerance {text}: a bare number is the --target tolerance, already given")
        if key:
            keyed[key.strip()] = value
        else:
            bare = value
    return bare, keyed


def _refuse_writing_inputs(src: str, others: list[str | None], targets: dict[str, str | None]) -> None:
    """The reports and the spill directory are written: none may be, hold or lie in SRC (each file a glob
    matches, and its root when it reaches into subdirectories), the rules file or the baseline; and the
    two reports may not be one file."""
    from batchtool.core import fs  # (pyarrow's file systems: only once check runs, not for its --help)
    from batchtool.io.output import refuse_overlap

    sources = ([r for r in [fs.glob_root(src)] if r is not None] + fs.glob_files(src)) if fs.is_glob(src) else [src]
    refuse_overlap(sources + [p for p in others if p is not None], targets)
    json_file, junit_file = targets["--json"], targets["--junit"]
    if json_file is not None and junit_file is not None and os.path.realpath(json_file) == os.path.realpath(junit_file):
        raise UsageError(f"--json {json_file} and --junit {junit_file} are one file: give each report its own")


def _check_receipts(src: str, receipts: tuple[str, ...], exactly_once: bool, same_prefix: bool) -> None:
    """--receipts: one verdict line, exit 0 or 1."""
    from batchtool.check import receipts as judge  # only when asked: it opens SRC as batchtool.load does

    if not receipts or exactly_once == same_prefix:
        raise UsageError("--receipts PATH... takes one of --exactly-once and --same-prefix (and they take it)")
    verdict = (judge.exactly_once if exactly_once else judge.same_prefix)(src, receipts)
    click.echo(f"{'PASS' if verdict.passed else 'FAIL'} {verdict.line}")
    click.get_current_context().exit(verdict.exit_code)


@command("check", "batchtool check sample_data/parquet --rules sample_data/rules.toml --junit check.xml")
@click.argument("src")
@click.option("--rules", "rules_file", metavar="RULES.toml",
              help="Rules file (see `batchtool docs check`); flags add rules.")
@click.option("--label", metavar="COL",
              help="Label column of --num-classes, --target and --baseline (default: label).")
@click.option("--num-classes", type=int, help="Rule: every label is in [0, N).")
@click.option("--target", metavar="SPEC",
              help="Rule: class proportions within --tolerance of these, as stratify's --target gives them: P0,P1,... "
                   "(fractions such as 1/3 are exact), uniform, or CLASS=PROB pairs.")
@click.option("--tolerance", multiple=True, callback=_tolerances, metavar="X|KEY=X",
              help="X: allowed |proportion - target| for --target (default 0.01). KEY=X: tolerance of a --baseline "
                   "rule: proportions (0.02), lengths (0.1), nulls (0.01), rows (0.1). Repeatable.")
@click.option("--min-rows", type=int, help="Rule: at least N rows.")
@click.option("--max-rows", type=int, help="Rule: at most N rows.")
@click.option("--unique", multiple=True, metavar="COL[,COL...]", callback=_keys,
              help="Rule: no two rows share this key (repeat the flag for more keys).")
@columns_option("--no-nulls", help="Rule: no nulls in these columns (repeatable).")
@columns_option("--no-nan",
                help="Rule: no NaN in these float or list-of-float columns (repeatable).")
@click.option("--length", metavar="COL",
              help="Column of --min-length/--max-length and --baseline (default: the first list column).")
@click.option("--min-length", type=int, help="Rule: every row at least this long.")
@click.option("--max-length", type=int, help="Rule: every row at most this long.")
@click.option("--checksums", is_flag=True, help="Rule: the data files and the example index match the sizes and sha256 in DST's manifest.")
@click.option("--manifest", is_flag=True,
              help="Rules: DST's files match its manifest (checksums, rows, batches, schema); the default for a "
                   "batchtool output when no rule is given.")
@click.option("--crc", is_flag=True, help="Rule: every TFRecord record's CRCs are valid (corrupt ones are counted).")
@click.option("--min-padding-efficiency", type=float, metavar="X",
              help="Rule: real / padded elements at least X (bucket and segment output).")
@click.option("--min-bucket-padding-efficiency", type=float, metavar="X",
              help="Rule: real / padded elements at least X in every bucket (bucket output).")
@click.option("--min-batch-rows", type=int, metavar="N", help="Rule: every batch holds at least N rows.")
@click.option("--max-batch-rows", type=int, metavar="N", help="Rule: every batch holds at most N rows.")
@click.option("--batch-quotas", is_flag=True,
              help="Rule: every batch of a stratify --balanced-batches output holds its class quotas.")
@click.option("--rank-batches", is_flag=True,
              help="Rule: every training rank gets the same number of batches (skipped without a rank layout).")
@click.option("--baseline", metavar="OTHER",
              help="Rules: class proportions, length quantiles, null shares and row count within --tolerance of "
                   "OTHER's (a dataset, a batchtool output, or its manifest).")
@click.option("--key", metavar="COL", help="Column shown with offending rows (default: key, if present).")
@click.option("--receipts", multiple=True, metavar="PATH",
              help="Judge the receipt files batchtool.load(SRC, receipt=PATH) wrote (repeatable) instead of rules: "
                   "with --exactly-once or --same-prefix.")
@click.option("--exactly-once", is_flag=True,
              help="With --receipts: every example of every finished epoch was handed out exactly once.")
@click.option("--same-prefix", is_flag=True,
              help="With --receipts A --receipts B: two runs handed out the same batches up to where the shorter "
                   "stopped.")
@click.option("--max-offenders", type=int, help="Offending rows listed per rule (default 5).")
@click.option("--json", "json_file", metavar="FILE", help="Write the result as JSON ('-': to stdout, no table).")
@click.option("--junit", "junit_file", metavar="FILE", help="Write a JUnit XML report (one testcase per rule).")
@click.option("--memory", type=SIZE, default="1GB", show_default=True, metavar="SIZE",
              help="Memory for finding repeated unique keys and duplicate rows (their hashes go to --tmp-dir).")
@click.option("--tmp-dir", type=click.Path(file_okay=False), help="Where the hashes go (default: system temp).")
@input_options
@run_options
def check_cmd(src: str, rules_file: str | None, tolerance: tuple[float | None, dict[str, float]], baseline: str | None,
              key: str | None, receipts: tuple[str, ...], exactly_once: bool, same_prefix: bool,
              max_offenders: int | None, json_file: str | None, junit_file: str | None, input_format: str | None,
              skip_corrupt: bool, **kwargs: Any) -> None:
    """Check SRC against rules and print a table of them: PASS/FAIL, the measured value and the bound.

    Rules come from --rules RULES.toml and from the flags below (schema, nulls, NaN, label range,
    class proportions, rows per class, lengths, sequence agreement, unique keys, duplicate rows,
    row counts, padding efficiency, batch sizes and quotas, manifest checksums, TFRecord CRCs,
    drift against a --baseline). With no rule, a batchtool output directory is verified against
    its manifest (checksums, rows, batches, schema). One streaming pass reads only the columns the
    rules need. With --receipts, judges training runs' receipts instead (see `batchtool docs load`).
    Exit status: 0 all pass, 1 a rule fails, 2 bad usage or unreadable input.
    """
    # the evaluator, once it runs: --help (and `batchtool --help`) needs none of it
    from batchtool.check import (CheckOptions, RuleSet, check, junit_xml, load_rules, render_text, rules_from_flags,
                                 to_json)
    from batchtool.check.report import ReportFile

    if receipts or exactly_once or same_prefix:
        _check_receipts(src, receipts, exactly_once, same_prefix)
    run = make_run(kwargs)  # what it leaves are the rule flags, named as rules_from_flags takes them
    _refuse_writing_inputs(src, [rules_file, baseline], {"--json": None if json_file == "-" else json_file,
                                                         "--junit": junit_file, "--tmp-dir": run.tmp_dir})
    from_file = load_rules(rules_file) if rules_file else RuleSet()
    target_tolerance, drift_tolerances = tolerance
    flags = rules_from_flags(**kwargs, tolerance=target_tolerance, baseline=baseline,
                             drift_tolerances=drift_tolerances, drift_rules=not from_file.drift)
    options = CheckOptions(key=key, max_offenders=max_offenders,
                           format=input_format, skip_corrupt=skip_corrupt)
    with ExitStack() as stack:
        json_report, junit_report = (stack.enter_context(ReportFile(path, flag)) if path else None
                                     for path, flag in ((None if json_file == "-" else json_file, "--json"),
                                                        (junit_file, "--junit")))
        result = check(src, from_file + flags, options, run)
        if json_file == "-":
            click.echo(to_json(result), nl=False)
        else:
            click.echo(render_text(result, color=True), color=False if os.environ.get("NO_COLOR") else None)
        if json_report:
            json_report.write(to_json(result))
        if junit_report:
            junit_report.write(junit_xml(result))
    click.get_current_context().exit(result.exit_code)
