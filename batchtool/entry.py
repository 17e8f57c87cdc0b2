"""The `batchtool` command's entry point: signal handling in place before the heavy imports.

SIGINT and SIGTERM, whenever they come (while Python imports pyarrow, in a first pass, in a
spill, while writing), become an exception in the main thread, so every `with` and `finally`
on the way out removes its temporary and spill files; then one line goes to stderr and the
process ends at once with the shell's convention, 128 + the signal number (130, 143): whatever
its other threads are doing (a worker inside a long native call would otherwise keep the
interpreter's exit waiting for it, and the process running). This module imports
only the standard library, and `batchtool/__init__.py` imports nothing heavy, so the handlers
are set within the first milliseconds. The library itself never touches signal handlers:
they are the program's to set, and this is the program.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal, raised where the main thread is. Like KeyboardInterrupt it is no Exception, so only
    cleanup code sees it on its way out; unlike it, click does not turn it into "Aborted!"."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # a second signal stops at once, without cleanup (as SIGKILL would), if cleanup itself hangs
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    raise Interrupted(signum)


def main() -> None:
    """Run the command line with SIGINT and SIGTERM turned into clean exits; after an engine's runtime died under
    the command (engines.finalizing.skip_finalizing), end without finalizing it, with the command's status."""
    try:
        _command_line()
    except SystemExit as exc:
        from batchtool.exec.engines.finalizing import finalizing_skipped

        if finalizing_skipped():
            end_now(exc.code if isinstance(exc.code, int) else int(exc.code is not None))
        raise


def end_now(status: int) -> None:
    """End the process with `status` once stdout and stderr are flushed, without waiting for its other threads or
    finalizing anything (the command's own cleanup has run)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed stream: nothing more can be said
            pass
    os._exit(status)


def _command_line() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _interrupt)
    try:
        if sys.argv[1:] == ["--version"]:  # the one answer that needs none of the heavy imports (as click says it)
            from batchtool.core.version import version_line

            sys.stdout.write(version_line() + "\n")
            return
        from batchtool.cli import cli  # the heavy imports: pyarrow, numpy, click

        cli.main(prog_name="batchtool")
    except Interrupted as exc:
        if os.environ.get("BATCHTOOL_DEBUG") == "1" or "--debug" in sys.argv[1:]:
            import traceback

            traceback.print_exc()
        name = signal.Signals(exc.signum).name
        sys.stderr.write(f"error: interrupted by {name}; temporary files removed\n")
        end_now(128 + exc.signum)
    finally:
        for sig in SIGNALS:  # from here on a signal ends the exiting process the default way
            signal.signal(sig, signal.SIG_DFL)
