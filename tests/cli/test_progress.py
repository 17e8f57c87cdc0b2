"""--progress: every command shows a pass's progress as a bar on a terminal, as a line every few seconds where
stderr is a log (a pipe, a file), or not at all; `run` also takes it from its file."""

from __future__ import annotations

import io
import os
import re
import signal
import threading

import pytest
from parked_cli import start_parked

from memlimit import HANG_GUARD
from batchtool.core import progress
from batchtool.cli import cli
from batchtool.cli.common import PROGRESS_SECONDS
from batchtool.core.errors import UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.pipeline import execute, load

LINE = re.compile(r"(?P<desc>.+): (?P<done>[\d,]+)(/(?P<total>[\d,]+) rows \(\d+%\))?( rows)?, [\d,]+ rows/s, "
                  r"[\d.]+ s(?P<end>, done)?")


def test_every_command_that_runs_takes_progress():
    lacking = {name for name, command in cli.commands.items()
               if "--progress" not in {o for p in command.params for o in p.opts}}
    assert lacking == {"docs", "where", "step"}  # which print a page, or look up an index in milliseconds


def test_quiet_means_no_progress_unless_progress_is_given():
    assert RunSettings().shown == progress.Shown(None)
    assert RunSettings(quiet=True).shown.mode == "none"
    assert RunSettings(quiet=True, progress="lines", progress_seconds=0.5).shown == progress.Shown("lines", 0.5)


def progress_lines(proc, desc: str) -> list[str]:
    """The child's stderr lines up to its first progress line of the pass `desc` with anything done (read as they
    come: no waiting)."""
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, f"the child's stderr ended without a progress line of {desc!r}: {lines}"
        lines.append(line.rstrip("\n"))
        found = LINE.fullmatch(lines[-1])
        if found and found["desc"] == desc and found["done"] != "0":
            return lines


def stop(proc) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130, err


@pytest.mark.parametrize("flags", [(), ("-q", "--progress", "lines")])
def test_a_command_whose_stderr_is_a_pipe_prints_lines_while_a_pass_runs(tmp_path, parquet_src, flags):
    """The default where stderr is no terminal, and --progress lines: the child is parked inside its writing pass
    (after its first 50 rows), and a line of that pass comes every BATCHTOOL_PROGRESS_SECONDS meanwhile."""
    env = {**os.environ, PROGRESS_SECONDS: "0.01"}
    proc = start_parked("pass:convert: write", "convert", parquet_src, tmp_path / "dst", "--shard-rows", "50",
                        "--threads", "2", *flags, env=env)
    try:
        lines = progress_lines(proc, "convert: write")
        assert re.fullmatch(r"convert: write: 50/300 rows \(17%\), [\d,]+ rows/s, [\d.]+ s", lines[-1]), lines
        assert all(LINE.fullmatch(line) for line in lines), lines
    finally:
        stop(proc)


def test_a_pipeline_prints_lines_too(tmp_path, parquet_src):
    (tmp_path / "p.toml").write_text(f'[input]\npath = "{parquet_src}"\n\n[[stage]]\nop = "shuffle"\n\n'
                                     f'[output]\npath = "{tmp_path / "out"}"\n')
    proc = start_parked("pass:stage 1 (shuffle): write", "run", tmp_path / "p.toml", "--threads", "2", "-q",
                        "--progress", "lines", env={**os.environ, PROGRESS_SECONDS: "0.01"})
    try:
        assert LINE.fullmatch(progress_lines(proc, "stage 1 (shuffle): write")[-1])["total"] == "300"
    finally:
        stop(proc)


class Written(io.StringIO):
    """A stderr that tells a waiting test each line written."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.wrote.set()
        return n


def test_lines_count_what_was_done_and_a_pass_that_printed_ends_with_done():
    out = Written()
    with progress.Lines("bucket: spill", 1000, "rows", 0.001, out) as lines:
        lines.update(250)
        assert out.wrote.wait(120)  # a hang guard only: the timer prints within a millisecond
        lines.update(750)
    last = out.getvalue().splitlines()[-1]
    assert re.fullmatch(r"bucket: spill: 1,000/1,000 rows \(100%\), [\d,]+ rows/s, [\d.]+ s, done", last)
    assert all(LINE.fullmatch(line) for line in out.getvalue().splitlines())


def test_a_pass_shorter_than_the_interval_prints_nothing_and_an_error_prints_no_done():
    out = Written()
    with progress.Lines("shuffle: spill", None, "rows", 3600, out) as lines:
        lines.update(5)
    assert out.getvalue() == ""
    with pytest.raises(KeyError), progress.Lines("shuffle: spill", None, "rows", 0.001, out):
        assert out.wrote.wait(120)  # a hang guard only
        raise KeyError
    assert "done" not in out.getvalue() and LINE.fullmatch(out.getvalue().splitlines()[0])["total"] is None


def test_the_progress_key_of_a_pipeline_file_is_the_runs_unless_the_command_line_says(tmp_path, parquet_src,
                                                                                      monkeypatch):
    (tmp_path / "p.toml").write_text(f'progress = "lines"\n[input]\npath = "{parquet_src}"\n\n[[stage]]\n'
                                     f'op = "shuffle"\n\n[output]\npath = "{tmp_path / "out"}"\n')
    assert load(str(tmp_path / "p.toml")).progress == "lines"
    ran = []

    class Ran(Exception):
        pass

    def recorded(config, run, dry_run):
        ran.append(run)
        raise Ran

    monkeypatch.setattr(execute, "run_pipeline", recorded)
    for args, shown in [((), "lines"), (("--progress", "bar"), "bar"), (("-q",), "none")]:
        with pytest.raises(Ran):
            cli.main(["run", str(tmp_path / "p.toml"), *args], standalone_mode=False)
        assert ran[-1].shown.mode == shown
    (tmp_path / "p.toml").write_text('progress = "loud"\n')
    with pytest.raises(Exception, match="key 'progress'"):
        load(str(tmp_path / "p.toml"))


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_interval_is_one_line(tmp_path, parquet_src, run_cli, monkeypatch, value):
    monkeypatch.setenv(PROGRESS_SECONDS, value)
    result = run_cli("convert", parquet_src, tmp_path / "dst")
    assert (result.exit_code, result.stderr) == (
        2, f"error: {PROGRESS_SECONDS}={value}: expected a number of seconds above 0 (e.g. 5, 0.5)\n")
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("settings,message", [
    ({"progress": "loud"}, "--progress 'loud': expected one of bar, lines, none"),
    ({"progress_seconds": 0}, "--progress-seconds 0: must be a number of seconds above 0"),
    ({"progress_seconds": float("inf")}, "--progress-seconds inf: must be a number of seconds above 0"),
])
def test_run_settings_refuse_what_cannot_show_progress(settings, message):
    with pytest.raises(UsageError) as raised:
        RunSettings(**settings)
    assert str(raised.value) == message
