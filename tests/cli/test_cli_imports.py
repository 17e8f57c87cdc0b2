"""A command imports what it runs: `batchtool segment` loads segment's op and the pieces every command shares, never
check's evaluator, another op or Ray; the group still lists every command, each found by its name."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_help import batchtool_env
from memlimit import HANG_GUARD

from batchtool.cli import cli
from batchtool.ops import OPERATIONS


CHILD = """
import json, sys
from batchtool.entry import main
sys.argv = ["batchtool", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert exc.code in (None, 0), exc.code
sys.stderr.write(json.dumps(sorted(sys.modules)))
"""


def _imported(*args: str) -> tuple[str, set[str]]:
    """What `batchtool ARGS` prints, and the modules it imported by then (sys.modules in a child, through the
    command's own entry point)."""
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=batchtool_env(),
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, set(json.loads(done.stderr))


def test_segment_help_imports_no_other_command_s_code():
    out, imported = _imported("segment", "--help")
    assert out.startswith("Usage: batchtool segment [OPTIONS] SRC DST")
    assert "batchtool.ops.segment" in imported  # its --help is generated from its definition
    others = tuple(f"batchtool.ops.{name}" for name in OPERATIONS if name != "segment")
    unneeded = (*others, "batchtool.check", "batchtool.cli.check", "batchtool.pipeline", "batchtool.exec.driver",
                "ray", "pandas", "tqdm")  # the driver and the progress bar only once it runs
    assert sorted(m for m in imported if any(m == u or m.startswith(u + ".") for u in unneeded)) == []


def test_every_listed_command_is_found_by_its_name():
    """Every command the group lists, made when asked for, is the command of that name (an op's registry entry
    names the module whose OP is that op)."""
    assert {"check", "convert", "docs", "inspect", "run", "step", "where", *OPERATIONS} == set(cli.commands)
    assert [name for name, command in cli.commands.items() if command.name != name] == []
    assert [name for name, op in OPERATIONS.items() if op.name != name] == []
