"""Local paths and object-store URIs (s3://, gs://, hdfs://...) behind one small interface, via pyarrow.fs.

Plain paths keep using the OS directly (fastest); anything with a scheme goes through
pyarrow's filesystems, which read credentials and endpoints from the usual environment
(e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import os
import posixpath
import secrets
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs

from batchtool.core.errors import DestinationError, InputError, first_line

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


def is_empty_dir(path: str) -> bool:
    """A directory (not a link to one) with no entry at all, hidden ones included."""
    if is_uri(path):
        fs, p = _resolve(path)
        return (fs.get_file_info(p).type == pafs.FileType.Directory
                and not fs.get_file_info(pafs.FileSelector(p, recursive=False)))
    try:
        return not os.path.islink(path) and os.path.isdir(path) and not os.listdir(path)
    except OSError:  # unreadable: it may hold something
        return False


def file_size(path: str) -> int:
    return _info(path).size if is_uri(path) else os.path.getsize(path)


def open_input(path: str, sequential: bool = False) -> BinaryIO:
    """A binary reader; OSError when it cannot be opened. `sequential` readers of object stores
    are read-ahead buffered streams, so small reads do not each become a request."""
    if is_uri(path):
        fs, p = _resolve(path)
        return fs.open_input_stream(p, buffer_size=_READ_BUFFER) if sequential else fs.open_input_file(p)
    return open(path, "rb", buffering=_READ_BUFFER)


def open_random_access(path: str) -> pa.NativeFile:
    """A file for random reads (an Arrow IPC file's batches, an index's columns): memory-mapped when local, so
    what is read is a view of the page cache; a seekable reader of the object store otherwise."""
    if is_uri(path):
        fs, p = _resolve(path)
        return fs.open_input_file(p)
    return pa.memory_map(path, "r")


def read_text(path: str) -> str:
    with open_input(path) as f:
        return f.read().decode("utf-8")


def read_json(path: str, max_bytes: int, what: str, unreadable: str = "unreadable") -> Any:
    """A small JSON file (`what` it is, for the errors), whole, refused beyond max_bytes before it is read, and
    never read past them (a file that grows meanwhile); InputError naming it otherwise."""
    size = file_size(path)
    if size <= max_bytes:
        try:
            with open_input(path) as f:
                data = f.read(max_bytes + 1)
            size = len(data)
            if size <= max_bytes:
                return json.loads(data.decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise InputError(f"{path}: {unreadable} ({first_line(exc)})") from exc
    raise InputError(f"{path}: {size:,} bytes, too large for {what} (at most {max_bytes:,})")


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


def is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _glob_split(pattern: str) -> tuple[str, str]:
    """(the directory before a glob's first wildcard, the rest of the pattern)."""
    head = pattern[: min(pattern.index(c) for c in "*?[" if c in pattern)]
    if "/" not in head:
        return ".", pattern
    base, _, name = head.rpartition("/")
    return base or "/", pattern[len(base) + 1:]


def glob_files(pattern: str) -> list[str]:
    """Files matching a glob; on object stores the part before the first wildcard is listed and filtered."""
    if not is_uri(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    return [f for f in walk_files(_glob_split(pattern)[0]) if fnmatch.fnmatch(f, pattern)]


def glob_root(pattern: str) -> str | None:
    """The directory below which a glob can match files in subdirectories (an output written there would
    be read back by the same glob); None when it only matches names in one directory."""
    base, rest = _glob_split(pattern)
    if is_uri(pattern) or "**" in rest or "/" in rest:  # on object stores fnmatch's * crosses '/'
        return base
    return None


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


# -- where a command may write --------------------------------------------------------------------------


def check_shared(directory: str, dst: str | None = None) -> None:
    """In a task on a worker: stop if the directory the driver made beside DST for the workers is not here (a
    node that does not mount DST's filesystem), naming DST and the node."""
    if not os.path.isdir(directory):
        raise DestinationError(f"{dst + ': ' if dst else ''}the exchange directory {directory} is not visible on "
                               f"{socket.gethostname()}: with --engine ray the workers write temporary files beside "
                               "DST, so DST must be on storage every node shares")


def overlap(path: str, others: Iterable[str]) -> tuple[str, str] | None:
    """The first of `others` that is `path`, contains it or lies inside it, with that relation
    ("is", "is inside", "contains"); None if none does.

    Local paths are compared after resolving symlinks and '..', by device and inode, so a symlink,
    a bind mount or another spelling on a case-insensitive disk is the same place. Object-store
    URIs compare scheme, bucket and key prefix, component by component (s3://b/data is not inside
    s3://b/dat). A local path and a URI never overlap (except file:// URIs, which are local).
    """
    chains = _Chains()
    for other in others:
        relation = chains.relation(path, other)
        if relation is not None:
            return other, relation
    return None


def identity(path: str) -> tuple:
    """What two spellings of one file share: a local file's device and inode (after symlinks), an object's scheme and
    normalised key (so a file listed by two inputs is found whatever they call it)."""
    local = _local_path(path)
    if local is None:
        return _uri_parts(path)
    try:
        st = os.stat(local)
    except OSError:
        return ("path", os.path.realpath(local))
    return st.st_dev, st.st_ino


def _local_path(path: str) -> str | None:
    if not is_uri(path):
        return path
    scheme, _, rest = path.partition("://")
    return rest if scheme.lower() == "file" else None


def _uri_parts(uri: str) -> tuple[str, ...]:
    scheme, _, rest = uri.partition("://")
    return (scheme.lower(), *(p for p in posixpath.normpath("/" + rest).split("/") if p))


class _Chains:
    """Identities (device, inode) of local paths and of their existing ancestors, remembered per directory."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, int] | None] = {}
        self._chains: dict[str, list[tuple[int, int]]] = {}

    def _id(self, real: str) -> tuple[int, int] | None:
        if real not in self._ids:
            try:
                st = os.stat(real)
                self._ids[real] = (st.st_dev, st.st_ino)
            except OSError:
                self._ids[real] = None
        return self._ids[real]

    def chain(self, path: str) -> list[tuple[int, int]]:
        """The path's own identity (if it exists) and its ancestors', innermost first."""
        if path not in self._chains:
            real, out = os.path.realpath(path), []
            while True:
                ident = self._id(real)
                if ident is not None:
                    out.append(ident)
                parent = os.path.dirname(real)
                if parent == real:
                    break
                real = parent
            self._chains[path] = out
        return self._chains[path]

    def relation(self, a: str, b: str) -> str | None:
        la, lb = _local_path(a), _local_path(b)
        if la is None and lb is None:
            pa_, pb = _uri_parts(a), _uri_parts(b)
            n = min(len(pa_), len(pb))
            if pa_[:n] != pb[:n]:
                return None
            return "is" if len(pa_) == len(pb) else "is inside" if len(pa_) > len(pb) else "contains"
        if la is None or lb is None:
            return None
        ia, ib = self._id(os.path.realpath(la)), self._id(os.path.realpath(lb))
        if ia is not None and ia == ib:
            return "is"
        if ib is not None and ib in self.chain(la):
            return "is inside"
        if ia is not None and ia in self.chain(lb):
            return "contains"
        return None


def os_reason(exc: OSError) -> str:
    """The OS's words for a failure ('No space left on device'), without pyarrow's wrapping of them."""
    return os.strerror(exc.errno) if exc.errno else str(exc)


@contextmanager
def write_errors(what: str) -> Iterator[None]:
    """The OS refusing a write (no space, no permission, read-only, not a directory) as one
    DestinationError, '<what>: <the OS's reason>'. Only around writes: a failed read is not DST's fault."""
    try:
        yield
    except OSError as exc:
        raise DestinationError(f"{what}: {os_reason(exc)}") from exc


def make_unique_dir(parent: str, prefix: str) -> str:
    """A new directory `parent/prefix<random>` with the permissions the umask gives, as any directory the
    user makes (tempfile.mkdtemp's are 0700: fine for scratch, wrong for an output renamed into place)."""
    return _make_unique(parent, prefix, os.mkdir)


def make_unique_file(parent: str, prefix: str) -> str:
    """A new empty file `parent/prefix<random>` with the permissions the umask gives (tempfile.mkstemp's are 0600),
    for a file renamed into place when written."""
    return _make_unique(parent, prefix, lambda path: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                                                       0o666)))


def _make_unique(parent: str, prefix: str, make: Callable[[str], None]) -> str:
    for _ in range(100):
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            make(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", parent)


def remove_tree(path: str) -> None:
    """Remove a temporary directory; if a signal interrupts the removal, finish it before passing the
    signal on, so an interrupted run still leaves nothing behind."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
