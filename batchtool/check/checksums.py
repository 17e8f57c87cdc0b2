"""The `checksums` rule: every file a batchtool output's manifest lists (its data files and example index), by size
and sha256, and any data file it does not list; read before any data, so a damaged output is named as such rather
than as unreadable data."""

from __future__ import annotations

import hashlib
import os

from batchtool.core import fs
from batchtool.check.report import Offender, RuleResult, every, verdict
from batchtool.check.rules import Checksums
from batchtool.core.errors import InputError
from batchtool.io.inputs import resolve_paths
from batchtool.io.manifest import MANIFEST_NAME, OutputFile, index_files, output_files
from batchtool.io.manifest_reader import read_manifest
from batchtool.core.runner import Executor

_HASH_READ_BYTES = 1 << 20


def judge_checksums(rule: Checksums, src: str, limit: int, executor: Executor) -> RuleResult:
    """Size and sha256 of every file the manifest lists (the example index too), plus data files it does not list."""
    manifest = read_manifest(src) if fs.is_dir(src) else None
    if manifest is None:
        raise InputError(f"{rule.label}: {src} is not a batchtool output directory (no {MANIFEST_NAME} "
                         "listing the files and their checksums)")
    files = output_files(src, manifest)
    index = index_files(src, manifest)
    checked = list(executor.map(file_problem, files + index))
    problems = [p for p in checked[:len(files)] if p is not None]
    listed = {os.path.normpath(f.name) for f in files}
    problems += [Offender("not listed in the manifest", path) for path in _data_files(src)
                 if os.path.normpath(os.path.relpath(path, src)) not in listed]
    damaged = [Offender(f"the example index: {p.detail}", p.file) for p in checked[len(files):] if p is not None]
    parts = ([] if not problems else ["the only file differs" if len(files) == 1
                                      else f"{len(problems)} of {len(files)} files differ"]) \
        + (["the example index differs"] if damaged else [])
    measured = "; ".join(parts) or f"{every(len(files), 'file')} {'matches' if len(files) == 1 else 'match'}"
    problems += damaged
    return verdict(rule, not problems, measured, "size and sha256 as in the manifest", len(problems),
                   len(problems), problems[:limit])


def _data_files(src: str) -> list[str]:
    try:
        return resolve_paths(src)
    except InputError:  # every data file is gone: each is reported missing already
        return []


def file_problem(file: OutputFile) -> Offender | None:
    """What is wrong with one listed output file, or None."""
    if not fs.is_file(file.path):
        return Offender("missing", file.path)
    size = fs.file_size(file.path)
    if size != file.bytes:
        what = "truncated" if size < file.bytes else "grown"
        return Offender(f"{what}: {size:,} bytes, the manifest says {file.bytes:,}", file.path)
    h = hashlib.sha256()
    with fs.open_input(file.path, sequential=True) as f:
        while block := f.read(_HASH_READ_BYTES):
            h.update(block)
    if h.hexdigest() != file.sha256:
        return Offender(f"changed: sha256 {h.hexdigest()[:16]}..., the manifest says {file.sha256[:16]}...",
                        file.path)
    return None
