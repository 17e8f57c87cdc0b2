"""Local paths and object-store URIs (s3://, gs://, hdfs://...) behind one small interface, via pyarrow.fs.

Plain paths keep using the OS directly (fastest); anything with a scheme goes through
pyarrow's filesystems, which read credentials and endpoints from the usual environment
(e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
from typing import BinaryIO

import pyarrow.fs as pafs

from batchtool.errors import InputError

_READ_BUFFER = 1 << 20


def is_uri(path: str) -> bool:
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:
        raise InputError(f"{uri}: cannot open this location ({exc})") from exc


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if is_uri(base) else os.path.join(base, name)


def _info(path: str) -> pafs.FileInfo:
    fs, p = _resolve(path)
    return fs.get_file_info(p)


def is_file(path: str) -> bool:
    return _info(path).type == pafs.FileType.File if is_uri(path) else os.path.isfile(path)


def is_dir(path: str) -> bool:
    return _info(path).type == pafs.FileType.Directory if is_uri(path) else os.path.isdir(path)


def exists(path: str) -> bool:
    return _info(path).type != pafs.FileType.NotFound if is_uri(path) else os.path.lexists(path)


def file_size(path: str) -> int:
    return _info(path).size if is_uri(path) else os.path.getsize(path)


def open_input(path: str, sequential: bool = False) -> BinaryIO:
    """A binary reader; OSError when it cannot be opened. `sequential` readers of object stores
    are read-ahead buffered streams, so small reads do not each become a request."""
    if is_uri(path):
        fs, p = _resolve(path)
        return fs.open_input_stream(p, buffer_size=_READ_BUFFER) if sequential else fs.open_input_file(p)
    return open(path, "rb", buffering=_READ_BUFFER)


def read_text(path: str) -> str:
    with open_input(path) as f:
        return f.read().decode("utf-8")


def walk_files(root: str) -> list[str]:
    """Every file below a directory, recursively, skipping hidden (.x) and private (_x) entries."""
    if not is_uri(root):
        found = []
        for base, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            found.extend(os.path.join(base, f) for f in files if not f.startswith((".", "_")))
        return sorted(found)
    fs, p = _resolve(root)
    infos = fs.get_file_info(pafs.FileSelector(p, recursive=True))
    files = []
    for info in infos:
        rel = posixpath.relpath(info.path, p)
        if info.type == pafs.FileType.File and not any(part.startswith((".", "_")) for part in rel.split("/")):
            files.append(f"{root.split('://', 1)[0]}://{info.path}")
    return sorted(files)


def glob_files(pattern: str) -> list[str]:
    """Files matching a glob; on object stores the part before the first wildcard is listed and filtered."""
    if not is_uri(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    head = pattern[: min(pattern.index(c) for c in "*?[" if c in pattern)]
    base = head.rsplit("/", 1)[0]
    return [f for f in walk_files(base) if fnmatch.fnmatch(f, pattern)]


def upload_directory(local: str, dst: str, overwrite: bool) -> None:
    """Copy a finished local output directory to an object-store prefix: data files first, manifest last.

    Object stores have no atomic rename, so readers must treat DST as complete only once the
    manifest exists; on failure the objects written so far are deleted. The manifest is the one
    file named like those walk_files skips (a leading dot), so those go last.
    """
    fs, prefix = _resolve(dst)
    names = sorted(os.listdir(local), key=lambda n: (n.startswith((".", "_")), n))
    written = []
    try:
        if overwrite and fs.get_file_info(prefix).type != pafs.FileType.NotFound:
            fs.delete_dir_contents(prefix, missing_dir_ok=True)
        for name in names:
            target = f"{prefix}/{name}"
            pafs.copy_files(os.path.join(local, name), target, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=fs)
            written.append(target)
    except BaseException:
        for target in written:
            try:
                fs.delete_file(target)
            except OSError:
                pass
        raise
