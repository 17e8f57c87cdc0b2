"""Faults and signals end in one `error:` line, the conventional exit status, DST and SRC as they were,
and no temporary, spill or output-in-progress file left (listing DST's parent and the temp dirs)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile

import pytest
from conftest import REPO, write_parquet_shards
from dirstate import snapshot
from parked_cli import start_parked

from memlimit import HANG_GUARD
from batchtool.core.synthetic import make_table

ROOT = os.geteuid() == 0


@pytest.fixture
def place(tmp_path, parquet_src, monkeypatch):
    """SRC (tmp/src, 300 rows), an existing DST (tmp/dst) and a private system temp dir (tmp/systmp)."""
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "old").write_text("the previous run")
    (tmp_path / "systmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "systmp"))  # for child processes
    monkeypatch.chdir(tmp_path)
    return tmp_path


def mount_tmpfs(path, *options: str) -> None:
    """Mount a tmpfs (root only; the test skips where mounting is not allowed)."""
    path.mkdir(exist_ok=True)
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


@pytest.fixture
def mounts():
    """Mount points to unmount after the test, whatever happens."""
    made: list = []
    yield made
    for path in made:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def full_disk(place, mounts):
    """A 64 KiB filesystem: far smaller than any output or spill of the test data."""
    disk = place / "small"
    mount_tmpfs(disk, "size=64k")
    mounts.append(disk)
    return disk


@pytest.fixture
def unwritable(place, mounts):
    """A directory nobody may create entries in: a read-only tmpfs as root (root ignores mode bits),
    mode 0555 otherwise."""
    path = place / "readonly"
    if ROOT:
        mount_tmpfs(path, "ro", "size=64k")
        mounts.append(path)
    else:
        path.mkdir()
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    yield path


REASON = "(No space left on device|File too large|Read-only file system|Permission denied)"


def assert_one_error(stderr: str, pattern: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert re.fullmatch(f"error: {pattern}\n", stderr), stderr


# -- faults -------------------------------------------------------------------------------------------------


def test_full_dst_filesystem_keeps_the_old_dst_and_leaves_nothing(place, full_disk, run_cli):
    (full_disk / "dst").mkdir()
    (full_disk / "dst" / "old").write_text("the previous run")
    before = snapshot(place)
    result = run_cli("convert", "src", full_disk / "dst", "--overwrite", "-q")
    assert result.exit_code == 2
    assert_one_error(result.stderr, f"{full_disk}/dst: cannot write the output \\(part-00000.parquet\\): "
                                    "No space left on device")
    assert snapshot(place) == before


def test_full_tmp_dir_removes_its_spill_files(place, full_disk, run_cli):
    before = snapshot(place)
    result = run_cli("shuffle", "src", "out", "--tmp-dir", full_disk, "--memory", "256KB", "-q")  # the rows
    assert result.exit_code == 2  # outgrow the quarter of --memory the local engine holds in memory, so they spill
    assert_one_error(result.stderr, f"--tmp-dir {full_disk}: cannot write temporary files: No space left on device")
    assert snapshot(place) == before


LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (96 * 1024, 96 * 1024))
sys.argv = ["batchtool", *sys.argv[1:]]
from batchtool.entry import main
main()
"""


@pytest.fixture
def big_src(place):
    """~1 MB of Parquet: every file written from it (output, spill) outgrows the 96 KiB file size limit."""
    return write_parquet_shards(str(place / "big"), make_table(3000, seed=3, median_length=60), shards=2,
                                row_group_size=500)


@pytest.mark.parametrize("command,pattern", [
    (("convert", "big", "dst", "--overwrite"), "dst: cannot write the output \\(part-00000.parquet\\): File too large"),
    (("shuffle", "big", "new", "--tmp-dir", "spills", "--memory", "2MB"),
     "--tmp-dir spills: cannot write temporary files: File too large"),
    (("bucket", "big", "new", "--boundaries", "10", "--batch-size", "8", "--tmp-dir", "spills", "--memory", "2MB"),
     "--tmp-dir spills: cannot write temporary files: File too large"),
])
def test_writes_failing_without_privileges_end_in_one_line(place, big_src, command, pattern):
    """The unprivileged twin of the full-disk tests: a file size limit makes every large write fail (the spills
    under a budget whose quarter, which the local engine holds in memory, the rows outgrow)."""
    (place / "spills").mkdir()
    before = snapshot(place)
    done = subprocess.run([sys.executable, "-c", LIMITED, *command, "-q"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 2, done.stderr
    assert_one_error(done.stderr, pattern)
    assert snapshot(place) == before


def test_dst_in_a_read_only_directory(place, unwritable, run_cli):
    before = snapshot(place)
    for dst in (unwritable / "out", unwritable / "a" / "b" / "out"):
        result = run_cli("convert", "src", dst, "-q")
        assert result.exit_code == 2
        assert_one_error(result.stderr, f"{dst}: cannot create the output directory: {REASON}")
    assert snapshot(place) == before


def test_tmp_dir_without_permission(place, unwritable, run_cli):
    before = snapshot(place)
    for tmp_dir in (unwritable, unwritable / "spills"):
        result = run_cli("bucket", "src", "out", "--boundaries", "10", "--batch-size", "4", "--tmp-dir", tmp_dir, "-q")
        assert result.exit_code == 2
        assert_one_error(result.stderr, f"--tmp-dir {tmp_dir}: cannot write temporary files: {REASON}")
    assert snapshot(place) == before


def test_dst_whose_parent_is_a_file(place, run_cli):
    (place / "afile").write_text("not a directory")
    before = snapshot(place)
    for dst in (place / "afile" / "out", place / "afile" / "deeper" / "out"):
        result = run_cli("convert", "src", dst, "-q")
        assert result.exit_code == 2
        assert result.stderr == f"error: {dst}: cannot create the output directory: {place / 'afile'} is not a directory\n"
    assert snapshot(place) == before


def test_missing_parents_made_for_a_failed_run_are_removed(place, run_cli):
    """DST's parents are made as `mkdir -p` would, but a run that fails takes them away again."""
    before = snapshot(place)
    result = run_cli("bucket", "src", place / "a" / "b" / "dst", "--boundaries", "10", "--max-tokens", "3", "-q")
    assert result.exit_code == 2, result.stderr
    assert snapshot(place) == before


# -- signals --------------------------------------------------------------------------------------------------


BUCKET = ("bucket", "src", "dst", "--overwrite", "--boundaries", "10", "--batch-size", "4", "--tmp-dir", "spills",
          "--threads", "2")
SHUFFLE = ("shuffle", "src", "dst", "--overwrite", "--tmp-dir", "spills", "--threads", "2")
CONVERT = ("convert", "src", "dst", "--overwrite", "--shard-rows", "50", "--threads", "2")


@pytest.mark.parametrize("where,args,sig,in_progress", [
    pytest.param("import:pyarrow", CONVERT, signal.SIGINT, [], id="start-up-SIGINT"),
    pytest.param("import:pyarrow", CONVERT, signal.SIGTERM, [], id="start-up-SIGTERM"),
    pytest.param("pass:bucket: lengths", BUCKET, signal.SIGTERM, [], id="first-pass"),
    pytest.param("pass:bucket: spill", BUCKET, signal.SIGINT, ["spill", "output"], id="bucket-spill"),
    pytest.param("pass:shuffle: spill", SHUFFLE, signal.SIGTERM, ["spill", "output"], id="shuffle-spill"),
    pytest.param("pass:bucket: write", BUCKET, signal.SIGTERM, ["spill", "output"], id="writing-from-spills"),
    pytest.param("pass:convert: write", CONVERT, signal.SIGINT, ["output"], id="writing"),
])
def test_a_signal_at_any_moment_cleans_up_and_exits_by_convention(place, where, args, sig, in_progress):
    (place / "spills").mkdir()
    before = snapshot(place)
    proc = start_parked(where, *args, "-q", cwd=str(place))
    found = {"spill": any(os.listdir(place / "spills")),
             "output": any(n.startswith(".dst.tmp-") for n in os.listdir(place))}
    assert [k for k, v in found.items() if v] == in_progress  # what the signal interrupts
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 128 + sig
    assert err == f"error: interrupted by {signal.Signals(sig).name}; temporary files removed\n"
    assert snapshot(place) == before  # SRC, the old DST, DST's parent, --tmp-dir and the system temp dir


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_process_while_a_worker_thread_is_in_a_long_native_call(place, sig):
    """The worker never returns: the process must not wait for it once its cleanup is done (it did, for good,
    growing, after printing its line)."""
    before = snapshot(place)
    proc = start_parked("worker:", *CONVERT, "-q", cwd=str(place))
    assert any(n.startswith(".dst.tmp-") for n in os.listdir(place))  # the output in progress
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 128 + sig
    assert err == f"error: interrupted by {signal.Signals(sig).name}; temporary files removed\n"
    assert snapshot(place) == before


def test_the_library_leaves_signal_handlers_alone(place, monkeypatch):
    """Only the command sets handlers: a program that imports batchtool keeps its own."""
    from batchtool.exec.convert import convert
    from batchtool.io.output import OutputOptions

    calls = []
    monkeypatch.setattr(signal, "signal", lambda *args: calls.append(args))
    convert("src", "new", OutputOptions())
    assert calls == []


def test_importing_batchtool_loads_nothing_heavy():
    """What lets the command set its handlers before pyarrow loads (see batchtool.entry)."""
    code = "import sys, batchtool; print(sorted(m for m in ('pyarrow', 'numpy', 'click') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.stdout == "[]\n", done.stderr
