"""Every command's `--help` example runs as written on sample_data/ (a copy: examples may write beside it)."""

from __future__ import annotations

import shlex
import shutil

import pytest

from cli_help import COMMANDS, REPO, example


@pytest.mark.parametrize("command", COMMANDS)
def test_help_example_runs_on_sample_data(command, tmp_path, monkeypatch, run_cli):
    """cwd holds a copy of sample_data/; an output under /tmp/ is moved into tmp_path, nothing else changes. Run in
    process, as the command line's own group runs it (the help texts themselves come from `python -m batchtool`)."""
    shutil.copytree(f"{REPO}/sample_data", tmp_path / "sample_data", ignore=shutil.ignore_patterns("out"))
    words = shlex.split(example(command))
    assert words[:2] == ["batchtool", command]
    args = [str(tmp_path / "out" / w[len("/tmp/"):]) if w.startswith("/tmp/") else w for w in words[1:]]
    monkeypatch.chdir(tmp_path)
    done = run_cli(*args)
    assert done.exit_code == 0, (example(command), done.stderr)
