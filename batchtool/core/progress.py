"""Progress on stderr: a bar on a terminal, a line every few seconds where stderr is a log (CI, nohup), or none."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

MODES = ("bar", "lines", "none")
"""--progress: a redrawn bar, a line every `Shown.seconds`, or nothing."""
LINE_SECONDS = 5.0
"""How often `lines` prints one (the command line's BATCHTOOL_PROGRESS_SECONDS changes it)."""


@dataclass(frozen=True)
class Shown:
    """How a run shows its progress: `mode`, one of MODES (None: a bar where stderr is a terminal, lines
    elsewhere, decided when a pass starts), and in `lines` the seconds between two lines (RunSettings checks
    both)."""

    mode: str | None = None
    seconds: float = LINE_SECONDS

    def resolved(self) -> str:
        """The mode, with stderr's kind deciding the default."""
        return self.mode or ("bar" if sys.stderr.isatty() else "lines")


HIDDEN = Shown("none")
"""No progress at all (a library run's pieces that show none of their own)."""


class Lines:
    """A pass's progress as a line on stderr every `seconds`: its name, the rows done of the total, the rate and
    the time so far. A timer thread prints them, so a pass stuck in one long call still shows it is alive; a pass
    shorter than `seconds` prints nothing, and one that printed ends with a `done` line."""

    def __init__(self, desc: str, total: int | None, unit: str, seconds: float, file: IO[str]) -> None:
        self.desc, self.total, self.unit, self.seconds, self.file = desc, total, unit, seconds, file
        self.n = 0
        self._started = time.monotonic()
        self._printed = False
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._tick, name="batchtool-progress", daemon=True)
        self._timer.start()

    def update(self, n: int = 1) -> None:
        self.n += n

    def _tick(self) -> None:
        while not self._stop.wait(self.seconds):
            self._line("")

    def _line(self, end: str) -> None:
        seconds = time.monotonic() - self._started
        done = f"{self.n:,}" + (f"/{self.total:,} {self.unit} ({100 * self.n / self.total:.0f}%)"
                                if self.total else f" {self.unit}")
        self.file.write(f"{self.desc}: {done}, {self.n / max(seconds, 1e-9):,.0f} {self.unit}/s, "
                        f"{seconds:.1f} s{end}\n")
        self.file.flush()
        self._printed = True

    def close(self, finished: bool = True) -> None:
        """Stop the timer; after a pass that printed and `finished` (not cut short by an error), its last line."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._timer.join()
        if finished and self._printed:
            self._line(", done")

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(finished=kind is None)


def bar(desc: str, total: int | None, shown: Shown = HIDDEN, unit: str = "rows") -> tqdm | Lines:
    """The progress of one pass named `desc` (`shuffle: spill`) over `total` units (None: unknown), as `shown`
    says; either kind counts with update(n) and ends with its `with` block."""
    mode = shown.resolved()
    if mode == "lines":
        return Lines(desc, total, unit, shown.seconds, sys.stderr)
    from tqdm import tqdm  # here, not at the top: a command's --help never draws a bar

    return tqdm(desc=desc, total=total, unit=unit, unit_scale=True, dynamic_ncols=True, leave=False,
                disable=mode == "none", file=sys.stderr)


__all__ = ["HIDDEN", "LINE_SECONDS", "MODES", "Lines", "Shown", "bar"]
