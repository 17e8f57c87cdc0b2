"""Hugging Face `datasets` directories as SRC: what `Dataset.save_to_disk` writes (one split: Arrow IPC stream files,
`dataset_info.json`, and `state.json` listing the files in order), read as Arrow IPC input; a `DatasetDict` root
(`dataset_dict.json`, one directory per split) is an error naming its splits."""

from __future__ import annotations

from typing import Any

from batchtool.core import fs
from batchtool.core.errors import InputError
from batchtool.io.manifest import dataset_file

STATE = "state.json"
"""A split's file list (`_data_files`, in order) and its format settings."""
DATASET_DICT = "dataset_dict.json"
"""A DatasetDict's list of splits, at its root."""
MAX_JSON_BYTES = 64 << 20
"""state.json and dataset_dict.json are read whole: files this large are not `datasets`'."""


def _json(path: str) -> Any:
    """A small JSON file, whole; InputError naming it otherwise."""
    return fs.read_json(path, MAX_JSON_BYTES, "a Hugging Face datasets file")


def _refuse_dataset_dict(src: str) -> None:
    """A DatasetDict root holds several splits: which one to read is the user's choice, so say which there are."""
    path = fs.join(src, DATASET_DICT)
    if not fs.is_file(path):
        return
    doc = _json(path)
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not (isinstance(splits, list) and splits and all(isinstance(s, str) for s in splits)):
        raise InputError(f"{path}: splits is {splits!r}, expected a list of split names")
    named = ", ".join(repr(s) for s in splits)
    raise InputError(f"{src}: a Hugging Face DatasetDict of {len(splits)} split(s) ({named}), not one dataset; give "
                     f"one split's directory as SRC, e.g. {fs.join(src, splits[0])}")


def split_files(src: str) -> list[str] | None:
    """The Arrow files of a `save_to_disk` directory of one split, in the order its state.json lists them (each
    relative and inside SRC, as a manifest's paths must be); None when SRC is not one; InputError for a
    DatasetDict root or a state.json that does not say which files."""
    _refuse_dataset_dict(src)
    path = fs.join(src, STATE)
    if not fs.is_file(path):
        return None
    doc = _json(path)
    files = doc.get("_data_files") if isinstance(doc, dict) else None
    if not (isinstance(files, list) and files):
        raise InputError(f"{path}: _data_files is {files!r}, expected a list of {{\"filename\": ...}} entries")
    paths = []
    for i, entry in enumerate(files):
        name = entry.get("filename") if isinstance(entry, dict) else None
        field = f"{path}: _data_files[{i}].filename"
        if not isinstance(name, str):
            raise InputError(f"{field} is {name!r}, expected a file name")
        file = dataset_file(src, name, field)
        if not fs.is_file(file):
            raise InputError(f"{field} {name!r}: no such file in {src}")
        paths.append(file)
    return paths
