"""A command imports what it runs: `batchtool segment` loads segment's op and the pieces every command shares, never
check's evaluator, another op or Ray, nor (reading Parquet, writing Arrow) the TFRecord codec's protobuf messages;
check's evaluator, the driver and the pipeline load when a command runs, not for --help, and no --help imports NumPy
or pyarrow; the group still lists every command, each found by its name."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from cli_help import COMMANDS, batchtool_env, help_text, recorded_help
from conftest import read_dir
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


CHECK_EVALUATOR = tuple(f"batchtool.check.{part}" for part in ("rules", "judge", "scan", "drift", "report", "evaluate"))
OTHER_OPS = tuple(f"batchtool.ops.{name}" for name in OPERATIONS if name != "segment")


def _imported(*args: str) -> tuple[str, set[str]]:
    """What `batchtool ARGS` prints, and the modules it imported by then (sys.modules in a child, through the
    command's own entry point)."""
    done = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True,
                          env=batchtool_env(), timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, set(json.loads(done.stderr.splitlines()[-1]))


def _among(imported: set[str], unneeded: tuple[str, ...]) -> list[str]:
    """The imported modules that are one of `unneeded` or inside one of them."""
    return sorted(m for m in imported if any(m == u or m.startswith(u + ".") for u in unneeded))


def test_segment_help_imports_no_other_command_s_code():
    out, imported = _imported("segment", "--help")
    assert out.startswith("Usage: batchtool segment [OPTIONS] SRC DST")
    assert "batchtool.ops.segment" in imported  # its --help is generated from its definition
    unneeded = (*OTHER_OPS, "batchtool.check", "batchtool.cli.check", "batchtool.pipeline", "batchtool.exec.driver",
                "ray", "pandas", "tqdm", "google.protobuf")  # the driver and the progress bar only once it runs
    assert _among(imported, unneeded) == []


def test_a_segment_run_imports_no_other_command_s_code(tmp_path):
    """The run itself, Parquet in and Arrow out: segment's op, the driver and those two formats' code, never check's
    evaluator, another op, Ray or the TFRecord codec's protobuf messages."""
    src, dst = tmp_path / "src.parquet", tmp_path / "dst"
    pq.write_table(pa.table({"key": ["a", "b", "c"], "tokens": [[1, 2, 3], [4], [5, 6, 7, 8, 9]]}), src)
    _, imported = _imported("segment", src, dst, "--key", "key", "--sequence", "tokens", "--num-unroll", "2",
                            "--batch-size", "2", "--quiet")
    assert {"batchtool.ops.segment", "batchtool.exec.driver", "batchtool.io.formats.arrow"} <= imported
    assert read_dir(str(dst)).column("key").to_pylist() == [
        "00000_of_00003:c", "00000_of_00002:a", "00001_of_00003:c", "00001_of_00002:a", "00002_of_00003:c",
        "00000_of_00001:b"]
    unneeded = (*OTHER_OPS, *CHECK_EVALUATOR, "batchtool.cli.check", "batchtool.pipeline", "ray", "torch",
                "google.protobuf", "batchtool.io.formats.example.messages")
    assert _among(imported, unneeded) == []


def test_commands_import_what_runs_them_only_to_run():
    """`batchtool --help` makes every command (for its short help) and imports every op's definition, yet no command's
    run: not check's evaluator, the driver, convert, inspect's summaries, the pipeline or Ray."""
    out, imported = _imported("--help")
    assert out.startswith("Usage: batchtool [OPTIONS] COMMAND")
    assert {f"batchtool.ops.{name}" for name in OPERATIONS} <= imported and "batchtool.cli.check" in imported
    unneeded = (*CHECK_EVALUATOR, "batchtool.exec.driver", "batchtool.exec.convert", "batchtool.exec.inspection",
                "batchtool.pipeline", "ray")
    assert _among(imported, unneeded) == []


ARRAYS = ("numpy", "pyarrow")
"""What the kernels import, never a --help made from declarations alone."""


def test_no_help_imports_arrays():
    """The options every command shares (input, output with each format's own, run) come from declarations
    (exec/settings.py, io/formats/declared.py), and each op's module imports its kernels where the op runs: the
    --help of every command the group lists, and the group's own (which makes every command for its short help),
    imports neither NumPy nor pyarrow, nor any format's module, and is the text recorded."""
    recorded = recorded_help()
    for name in ["", *cli.commands]:
        out, imported = _imported(*([name] if name else []), "--help")
        assert out == recorded[name]
        assert _among(imported, (*ARRAYS, "batchtool.io.formats.parquet", "batchtool.io.formats.arrow",
                                 "batchtool.io.formats.tfrecord", "batchtool.io.output")) == [], name or "batchtool"


def test_every_listed_command_is_found_by_its_name():
    """Every command the group lists, made when asked for, is the command of that name (an op's registry entry
    names the module whose OP is that op)."""
    assert {"check", "convert", "docs", "inspect", "run", "step", "where", *OPERATIONS} == set(cli.commands)
    assert [name for name, command in cli.commands.items() if command.name != name] == []
    assert [name for name, op in OPERATIONS.items() if op.name != name] == []


def test_every_help_is_the_one_recorded():
    """Every command's --help and the group's, byte for byte as recorded (tests/data/help_texts.json): how the
    commands are made (which modules their options are declared in, what they import) changes no text."""
    recorded = recorded_help()
    assert sorted(recorded) == ["", *COMMANDS]
    assert [c for c in recorded if help_text(c or None) != recorded[c]] == []
