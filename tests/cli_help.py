"""Every command's `--help`, as a user gets it from `python -m batchtool CMD --help` in a subprocess.

Read once per test session: tests/test_user_words.py checks their words, tests/test_help_examples.py
runs their examples.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

from batchtool.cli import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = sorted(cli.commands)
EXAMPLE = re.compile(r"^\s*Example:\n\s+(batchtool .+)$", re.MULTILINE)


def batchtool_env() -> dict[str, str]:
    """The caller's environment with this checkout first on the path, so a child runs the code under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@functools.cache
def help_text(command: str | None) -> str:
    """`batchtool [COMMAND] --help`, checked to exit 0 with nothing on stderr."""
    args = [sys.executable, "-m", "batchtool", *([command] if command else []), "--help"]
    done = subprocess.run(args, capture_output=True, text=True, env=batchtool_env(), timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), (args, done.stderr)
    return done.stdout


def example(command: str) -> str:
    """The one example line a command's help ends with (batchtool.cli.common.command puts it there)."""
    found = EXAMPLE.findall(help_text(command))
    assert len(found) == 1, (command, help_text(command))
    return found[0]
