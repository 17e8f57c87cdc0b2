"""batchtool's version, as the installed package's metadata says: what `--version` and every manifest show."""

from __future__ import annotations

from functools import cache


@cache
def version() -> str:
    """The installed distribution's version; "0.0.0+local" when running from a source tree that was not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("batchtool")
    except PackageNotFoundError:
        return "0.0.0+local"


def version_line() -> str:
    """What `batchtool --version` prints (click's words)."""
    return f"batchtool, version {version()}"
