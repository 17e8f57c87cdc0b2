"""The one reader of batchtool's TOML files (pipelines, check rules): bounded in size and nesting before the parser
sees them, every failure one error naming the file."""

from __future__ import annotations

import re
import sys
from typing import Any

from batchtool.core.errors import InputError, UsageError, first_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_BYTES = 1 << 20
"""A pipeline or rules file is a few kilobytes; beyond this it is refused before it is read."""
MAX_DEPTH = 32
"""Arrays and tables inside each other, and the parts of a dotted key: the files batchtool reads nest about 4
deep. The parser recurses per level of brackets (Python 3.10's tomli may be compiled C) and takes time quadratic in
a dotted key's parts, so both are counted before it runs, and the document it returns is measured again (dotted
keys and tables add up)."""

_SPECIAL = re.compile(r"""["'#\[\]{}.=,\n]""")
_SKIPPED = re.compile(r'''"{3}(?:[^"\\]|\\.|"{1,2}(?!"))*"{3,5}|'{3}(?:[^']|'{1,2}(?!'))*'{3,5}'''
                      r'''|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|\#[^\n]*''', re.S)
"""A string (multi-line or not, basic or literal) or a comment, whose brackets and dots are text. Each alternative
is unambiguous, so a match (or a failure, which ends the scan) costs time linear in what it reads."""


def read_toml(path: str, what: str) -> dict[str, Any]:
    """The document in `path` (`what` it is, e.g. "pipeline file", for the errors): InputError when it cannot be
    read, UsageError when it is too large, too deeply nested or not TOML."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:
        raise UsageError(f"{path}: more than {MAX_BYTES:,} bytes, too large for a {what}")
    try:
        text = data.decode("utf-8")
        _check_nesting(text, path)
        doc = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise UsageError(f"{path}: not valid TOML ({first_line(exc)})") from None
    if _depth(doc) > MAX_DEPTH:
        raise UsageError(f"{path}: arrays and tables nested more than {MAX_DEPTH} deep")
    return doc


def _check_nesting(text: str, path: str) -> None:
    """Refuse brackets nested, or a dotted key of more parts, beyond MAX_DEPTH, outside strings and comments, in
    time linear in the text. An unterminated string ends the scan: the parser then says where it is."""
    depth = dots = 0
    pos = 0
    while (found := _SPECIAL.search(text, pos)) is not None:
        char, pos = found.group(), found.end()
        if char in "\"'#":
            skipped = _SKIPPED.match(text, found.start())
            if skipped is None:
                return
            pos = skipped.end()
        elif char == ".":
            dots += 1
        else:
            dots = 0
            depth = max(depth + (char in "[{") - (char in "]}"), 0)
        if depth > MAX_DEPTH or dots >= MAX_DEPTH:
            what = "arrays and tables nested" if depth > MAX_DEPTH else "a dotted key of"
            raise UsageError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: {what} more than {MAX_DEPTH} "
                             f"{'deep' if depth > MAX_DEPTH else 'parts'}")


def _depth(doc: Any) -> int:
    """How deep arrays and tables nest in a parsed document (the document itself: 0), without recursing."""
    deepest = 0
    stack = [(doc, 0)]
    while stack:
        value, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
