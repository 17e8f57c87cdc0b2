"""Whether the program may finalize its engine's runtime as it exits: not once Ray's runtime died under it
(engines/ray_failures.py says so), which batchtool.entry asks without importing Ray."""

from __future__ import annotations

_finalize = True


def skip_finalizing() -> None:
    """Said when the raylet of the driver's own node died: tearing Ray down as the interpreter exits may crash, or
    end the process with Ray's status, so the program ends without finalizing once its command is over
    (batchtool.entry does, after the error line)."""
    global _finalize
    _finalize = False


def finalizing_skipped() -> bool:
    return not _finalize


__all__ = ["finalizing_skipped", "skip_finalizing"]
