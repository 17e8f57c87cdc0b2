"""What `check` found: per-rule results, drawn as a terminal table, JSON, or JUnit XML for CI systems."""

from __future__ import annotations

import errno
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any

import click

from batchtool.core import fs
from batchtool.core.errors import DestinationError
from batchtool.io.formats import registry
from batchtool.io.formats.base import Format
from batchtool.io.output import make_parents, remove_if_empty

PASS, FAIL, ERROR, SKIP = "PASS", "FAIL", "ERROR", "SKIP"
STATUS_COLORS = {PASS: "green", FAIL: "red", ERROR: "red", SKIP: "yellow"}
"""Status cells on a terminal (click.style colours); SKIP (a rule that does not apply) is no failure."""


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 file', '2 files', '1,024 batches': a count with the word in the right number."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def every(n: int, word: str, words: str | None = None) -> str:
    """'all 4 files', 'the only file', 'no files': the subject of a sentence about all of them."""
    many = words or word + "s"
    return f"all {n:,} {many}" if n > 1 else f"the only {word}" if n == 1 else f"no {many}"


@dataclass(frozen=True)
class Offender:
    """One offending row (file and row or record index, key value) or, for file-level rules, one file."""

    detail: str
    file: str | None = None
    row: int | None = None
    key: Any = None

    def describe(self, unit: str = "row") -> str:
        where = [p for p in (self.file, f"{unit} {self.row}" if self.row is not None else None) if p]
        if self.key is not None:
            where.append(f"key {self.key!r}")
        return ", ".join(where) + (": " if where else "") + self.detail


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict: `measured` and `bound` are for people, `value` for machines.

    `offending` counts every offending row (or file, or class); `offenders` lists the first of them.
    """

    name: str
    kind: str
    status: str
    measured: str
    bound: str
    value: Any = None
    offending: int = 0
    offenders: tuple[Offender, ...] = ()

    @property
    def message(self) -> str:
        return f"{self.name}: {self.measured} (expected {self.bound})"


def skipped(rule: Any, why: str) -> RuleResult:
    """A rule that does not apply to this dataset (e.g. equal batches per rank without a rank layout)."""
    return RuleResult(rule.name, rule.kind, SKIP, why, "-")


def verdict(rule: Any, ok: bool, measured: str, bound: str, value: Any = None, offending: int = 0,
            offenders: Sequence[Offender] = ()) -> RuleResult:
    """A rule's PASS or FAIL (`rule` is any check rule: its name and kind label the result)."""
    return RuleResult(rule.name, rule.kind, PASS if ok else FAIL, measured, bound, value, offending,
                      tuple(offenders))


@dataclass(frozen=True)
class CheckResult:
    src: str
    format: str | None
    rows: int | None
    rules: tuple[RuleResult, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(r.status in (PASS, SKIP) for r in self.rules)

    @property
    def exit_code(self) -> int:
        """0 when every rule passes, 1 when a rule fails (bad data); usage and read errors exit 2 before this."""
        return 0 if self.passed else 1

    @property
    def row_unit(self) -> str:
        return registry.get(self.format).unit if self.format else Format.unit

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.rules) for s in (PASS, FAIL, ERROR, SKIP)}

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "format": self.format, "rows": self.rows, "passed": self.passed,
                "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "counts": {k.lower(): v for k, v in self.counts().items()},
                "rules": [{**{k: v for k, v in asdict(r).items() if k != "offenders"},
                           "offenders": [asdict(o) for o in r.offenders]} for r in self.rules]}


def render_text(result: CheckResult, color: bool = False) -> str:
    """The rules table, then each failed rule's full measurement and first offenders, then a summary line.

    With `color`, statuses are styled (PASS green, FAIL red, SKIP yellow); click.echo strips the
    styles again when stdout is not a terminal.
    """
    def status(text: str, width: int = 0) -> str:
        styled = click.style(text, fg=STATUS_COLORS[text]) if color and text in STATUS_COLORS else text
        return styled + " " * (width - len(text))

    header = ("rule", "status", "measured", "bound")
    rows = [(r.name, r.status, _clip(r.measured), r.bound) for r in result.rules]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
    lines = [f"check {result.src}"
             + (f" ({result.format}, {plural(result.rows, result.row_unit)})" if result.rows is not None else ""),
             ""]
    lines += ["  ".join((status if i == 1 else str.ljust)(cell, w) for i, (cell, w) in enumerate(zip(row[:3], widths)))
              + "  " + row[3] for row in (header, *rows)]
    for r in result.rules:
        if r.status != PASS and (r.offenders or r.measured != _clip(r.measured)):
            more = r.offending - len(r.offenders)
            lines += ["", f"{status(r.status)} {r.name}: {r.measured}"]
            if r.offenders:
                lines.append(f"  first {len(r.offenders)} of {r.offending:,}:" if more > 0 else "  offenders:")
            lines += [f"    {o.describe(result.row_unit)}" for o in r.offenders]
    counts = result.counts()
    lines += ["", f"{plural(len(result.rules), 'rule')}: {counts[PASS]} passed, {counts[FAIL]} failed"
              + (f", {counts[ERROR]} not evaluated" if counts[ERROR] else "")
              + (f", {counts[SKIP]} skipped" if counts[SKIP] else "")
              + f" ({result.seconds:.2f} s)"]
    return "\n".join(lines)


_CELL = 64


def _clip(text: str) -> str:
    return text if len(text) <= _CELL else text[:_CELL - 3] + "..."


def to_json(result: CheckResult) -> str:
    return json.dumps(result.to_dict(), indent=2, default=_json_default) + "\n"


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def junit_xml(result: CheckResult) -> str:
    """One testsuite, one testcase per rule; a failed rule is a <failure>, an unevaluated one an <error>,
    one that does not apply <skipped>."""
    counts = result.counts()
    attrs = {"tests": str(len(result.rules)), "failures": str(counts[FAIL]), "errors": str(counts[ERROR]),
             "time": f"{result.seconds:.3f}"}
    suites = ET.Element("testsuites", {"name": "batchtool check", **attrs})
    suite = ET.SubElement(suites, "testsuite", {"name": f"batchtool check {result.src}",
                                                "skipped": str(counts[SKIP]), **attrs})
    for r in result.rules:
        case = ET.SubElement(suite, "testcase", {"classname": f"batchtool.check.{r.kind}", "name": r.name,
                                                 "time": "0"})
        if r.status == SKIP:
            ET.SubElement(case, "skipped", {"message": r.message})
        elif r.status != PASS:
            tag = "failure" if r.status == FAIL else "error"
            element = ET.SubElement(case, tag, {"message": r.message, "type": r.kind})
            element.text = "\n".join([r.message, *(o.describe(result.row_unit) for o in r.offenders)])
        ET.SubElement(case, "system-out").text = f"measured: {r.measured}\nbound: {r.bound}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


class ReportFile:
    """A report file (`flag` names it: --json, --junit) made ready before the check runs, so that a path that cannot
    be written stops the command before any work rather than after it: its missing directories are made, as a user
    expects of a report path, and an empty file beside it proves it can be written. `write` renames that file into
    place; leaving the block without writing (the check stopped) removes it and the directories made, and leaves an
    existing report as it was."""

    def __init__(self, path: str, flag: str) -> None:
        self.path, self.flag = path, flag
        self.tmp: str | None = None
        self.made: list[str] = []

    def __enter__(self) -> ReportFile:
        where = f"{self.flag} {self.path}"
        if os.path.isdir(self.path) or self.path.endswith(os.sep):
            raise DestinationError(f"{where}: is a directory; name a file")
        if os.path.lexists(self.path) and not os.access(self.path, os.W_OK):
            raise DestinationError(f"{where}: cannot write ({os.strerror(errno.EACCES)})")
        full = os.path.abspath(self.path)
        self.made = make_parents(full, f"{where}: cannot create its directory")
        try:
            with fs.write_errors(f"{where}: cannot write"):
                self.tmp = fs.make_unique_file(os.path.dirname(full), f".{os.path.basename(full)}.tmp-")
        except BaseException:
            remove_if_empty(self.made)
            raise
        return self

    def write(self, text: str) -> None:
        with fs.write_errors(f"{self.flag} {self.path}: cannot write"):
            with open(self.tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(self.tmp, self.path)
        self.tmp = None

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            with suppress(OSError):
                os.remove(self.tmp)
            remove_if_empty(self.made)
