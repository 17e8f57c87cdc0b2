"""Progress bars on stderr: shown on a terminal, silent when piped or with --quiet."""

from __future__ import annotations

import sys

from tqdm import tqdm


def bar(desc: str, total: int | None, unit: str = "rows", quiet: bool = False) -> tqdm:
    return tqdm(desc=desc, total=total, unit=unit, unit_scale=True, dynamic_ncols=True, leave=False,
                disable=quiet or not sys.stderr.isatty(), file=sys.stderr)
