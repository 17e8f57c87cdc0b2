"""Every command's `--help`, as a user gets it from `python -m batchtool CMD --help`, read in one child process.

Read once per test session: tests/cli/test_user_words.py checks their words, tests/cli/test_help_examples.py
runs their examples. One child prints them all (each through the command line's own `cli.main`, as
`python -m batchtool` calls it), so the suite starts Python and imports batchtool once, not once per command.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

from memlimit import HANG_GUARD
from batchtool.cli import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = sorted(cli.commands)
EXAMPLE = re.compile(r"^\s*Example:\n\s+(batchtool .+)$", re.MULTILINE)


RECORDED = os.path.join(REPO, "tests", "data", "help_texts.json")
"""Every command's --help as it was recorded (`python tests/cli_help.py` records it again, after a deliberate change
to help text): tests/cli/test_cli_imports.py checks that making commands from light declarations changed no byte."""


def batchtool_env() -> dict[str, str]:
    """The caller's environment with this checkout first on the path, so a child runs the code under test (help at
    click's default width: COLUMNS unset)."""
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


HELP_TEXTS = """
import contextlib, io, json, sys
from batchtool.cli import cli
texts = {}
for command in [None, *sorted(cli.commands)]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main([*([command] if command else []), "--help"], prog_name="batchtool", standalone_mode=False)
    texts[command or ""] = [status, out.getvalue(), err.getvalue()]
json.dump(texts, sys.stdout)
"""


@functools.cache
def _help_texts() -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", HELP_TEXTS], capture_output=True, text=True, env=batchtool_env(),
                          timeout=HANG_GUARD)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return json.loads(done.stdout)


def help_text(command: str | None) -> str:
    """`batchtool [COMMAND] --help`, checked to exit 0 with nothing on stderr."""
    status, out, err = _help_texts()[command or ""]
    assert (status, err) == (0, ""), (command, err)
    return out


def example(command: str) -> str:
    """The one example line a command's help ends with (batchtool.cli.common.command puts it there)."""
    found = EXAMPLE.findall(help_text(command))
    assert len(found) == 1, (command, help_text(command))
    return found[0]


def recorded_help() -> dict[str, str]:
    """RECORDED: `batchtool [COMMAND] --help` by command ('' for the group's own)."""
    with open(RECORDED, encoding="utf-8") as file:
        return json.load(file)


if __name__ == "__main__":
    with open(RECORDED, "w", encoding="utf-8") as out:
        json.dump({command: help_text(command or None) for command in ["", *COMMANDS]}, out, indent=1, sort_keys=True)
        out.write("\n")
