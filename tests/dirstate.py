"""What a failed run must leave as it was: the bytes under SRC and DST, the listing of DST's parent and
of the temporary directories (asserted as snapshots taken before and after the run)."""

from __future__ import annotations

import os


def snapshot(*roots: str | os.PathLike) -> dict[str, bytes | str | None]:
    """Every entry under the roots: file bytes, a symlink's target, None for a directory (and the
    roots themselves, so a removed or replaced root shows)."""
    found: dict[str, bytes | str | None] = {}
    for root in map(str, roots):
        if not os.path.lexists(root):
            continue
        if os.path.islink(root) or not os.path.isdir(root):
            found[root] = os.readlink(root) if os.path.islink(root) else open(root, "rb").read()
            continue
        found[root] = None
        for base, dirs, files in os.walk(root):
            for name in dirs:
                path = os.path.join(base, name)
                found[path] = os.readlink(path) if os.path.islink(path) else None
            for name in files:
                path = os.path.join(base, name)
                found[path] = os.readlink(path) if os.path.islink(path) else open(path, "rb").read()
    return found


def listing(*directories: str | os.PathLike) -> dict[str, list[str]]:
    """The names in each directory (not recursive): where stray temporary files would show."""
    return {str(d): sorted(os.listdir(d)) if os.path.isdir(d) else [] for d in directories}
