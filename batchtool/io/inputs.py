"""Opening a SRC (a file, directory or glob of shards of one format, local or a URI) as a
Dataset: its files found in a stable order, their one format detected, its manifest read, the schema fixed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from batchtool.core import fs
from batchtool.io.dataset import Dataset, Reading, Shard
from batchtool.core.errors import InputError
from batchtool.io.formats import column_meta, column_types, registry
from batchtool.io.manifest_reader import read_manifest
from batchtool.core.runner import SERIAL, Executor


def resolve_paths(src: str) -> list[str]:
    """Files of SRC in a stable order: a file, a directory (recursively, or as a format's own metadata lists
    them: a Hugging Face save_to_disk directory) or a glob; local or a URI."""
    if fs.is_glob(src):
        paths = fs.glob_files(src)
        if not paths:
            raise InputError(f"{src}: no files match this pattern")
        return paths
    if fs.is_file(src):
        return [src]
    if fs.is_dir(src):
        listed = next((files for f in registry.FORMATS.values() if (files := f.directory_files(src)) is not None), None)
        if listed is not None:
            return listed
        found = [p for p in fs.walk_files(src) if detect_format(p)]  # the manifest is neither hidden nor data
        if not found:
            raise InputError(f"{src}: empty input: no {registry.format_labels()} files in this directory")
        return found
    raise InputError(f"{src}: no such file or directory")


def detect_format(path: str, sniff: bool = False) -> str | None:
    """The format of a file by its name; with `sniff`, by its magic bytes when the name says nothing."""
    found = registry.detect(path)
    if found is not None or not sniff or fs.is_uri(path):
        return found
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return registry.detect(path, head)


def open_dataset(src: str, format: str | None = None, schema: pa.Schema | None = None,
                 options: Mapping[str, Any] | None = None, skip_corrupt: bool = False,
                 max_record_bytes: int | None = None, memory: int | None = None,
                 executor: Executor = SERIAL) -> Dataset:
    """Resolve SRC, check it is one readable format, and fix the schema every chunk will have. `options`: the
    format's reading options by name (its Reader.read_options; another format's are left out).

    A SRC whose files record no schema and that has no batchtool manifest gets its schema from a pass over
    every record (the format's). max_record_bytes: the largest unit of input read, and what one may decompress
    to when there is no `memory` (default:
    DEFAULT_MAX_RECORD_BYTES; the CLI passes --max-record-bytes); memory: the budget that decompressed input
    obeys instead (the CLI passes the command's --memory); executor: what runs a pass the opening needs (a
    schema scan).
    """
    src = os.fspath(src)
    paths = resolve_paths(src)
    if format is None:
        sniff = len(paths) == 1
        found = {detect_format(p, sniff) for p in paths}
        if None in found:
            bad = next(p for p in paths if detect_format(p, sniff) is None)
            raise InputError(f"{bad}: unknown format (expected a name ending in {registry.suffixes()}; "
                             "or pass --format)")
        if len(found) > 1:
            labels = sorted(registry.FORMATS[f].label for f in found)
            raise InputError(f"{src}: mixes {', '.join(labels[:-1])} and {labels[-1]} files; convert one part first")
        format = found.pop()
    if format not in registry.FORMATS:
        raise InputError(f"{src}: unknown format {format!r} (expected one of: {', '.join(registry.NAMES)})")
    shards = tuple(Shard(i, p, fs.file_size(p)) for i, p in enumerate(paths))
    manifest = read_manifest(src) if fs.is_dir(src) else None
    spec = registry.FORMATS[format]
    reading = Reading(spec.options_of(options or {}), skip_corrupt, max_record_bytes, memory, executor)
    dataset = spec.open_dataset(src, shards, schema, manifest, reading)
    # operations never see an extension type, and carry what the metadata says of a column with the column
    fixed = column_meta.carried(column_types.reading_schema(dataset.schema))
    return dataset if fixed is dataset.schema else replace(dataset, schema=fixed)
