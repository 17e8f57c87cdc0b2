"""The format registry: every format is found by name and suffix (Arrow also by magic), and checks its own options."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import batchtool
from batchtool.io.dataset import ReadReport
from batchtool.core.errors import UsageError
from batchtool.io.formats import registry
from batchtool.io.inputs import detect_format, open_dataset
from batchtool.io.output import OutputOptions


def test_registry_names_and_detection_by_name():
    assert registry.NAMES == ("parquet", "tfrecord", "arrow")
    assert [registry.detect(p) for p in ("a/x.parquet", "x.PQ", "x.tfrecord.gz", "x.tfrec", "x.arrow", "x.ipc",
                                        "x.json", ".batchtool_manifest.json")] == \
        ["parquet", "parquet", "tfrecord", "tfrecord", "arrow", "arrow", None, None]


def test_an_unnamed_file_is_recognised_by_its_magic_bytes_only_when_asked(tmp_path):
    path = tmp_path / "shard"
    path.write_bytes(b"ARROW1\0\0rest")
    assert detect_format(str(path)) is None and detect_format(str(path), sniff=True) == "arrow"
    path.write_bytes(b"PAR1rest")
    assert detect_format(str(path), sniff=True) == "parquet"
    path.write_bytes(b"nothing")
    assert detect_format(str(path), sniff=True) is None


@pytest.mark.parametrize("fmt, codec, suffix", [("parquet", "zstd", ".parquet"), ("tfrecord", "none", ".tfrecord"),
                                                 ("arrow", "none", ".arrow")])
def test_defaults_and_suffixes(fmt, codec, suffix):
    options = OutputOptions(format=fmt)
    assert options.codec == codec and options.suffix == suffix and options.spec is registry.get(fmt)
    assert OutputOptions(format="tfrecord", compression="gzip").suffix == ".tfrecord.gz"


@pytest.mark.parametrize("fmt, codec, message", [
    ("parquet", "lzma", "--compression 'lzma': Parquet takes zstd, snappy, gzip, lz4, brotli, none"),
    ("tfrecord", "zstd", "--compression 'zstd': TFRecord takes gzip or none"),
    ("arrow", "snappy", "--compression 'snappy': Arrow IPC takes none, lz4, zstd"),
    ("csv", None, "--to 'csv': expected parquet, tfrecord or arrow"),
])
def test_each_format_checks_its_codecs(fmt, codec, message):
    with pytest.raises(UsageError) as info:
        OutputOptions(format=fmt, compression=codec)
    assert str(info.value) == message


_NAME = "|".join(registry.NAMES)
_BRANCH = re.compile(rf"""(==|!=|\bis|\bcase)\s*["']({_NAME})["']|["']({_NAME})["']\s*(==|!=)"""
                     rf"""|\bin\s*[(\[{{][^)\]}}]*["']({_NAME})["']""")
"""A format's name compared with something: a branch that belongs in the format's module."""
PACKAGE = os.path.dirname(os.path.abspath(batchtool.__file__))


def test_no_format_name_branches_outside_the_formats_package():
    """Adding a format is adding one module: no code outside batchtool/io/formats/ asks which format it has."""
    found = []
    for folder, _, names in os.walk(PACKAGE):
        if os.path.relpath(folder, PACKAGE).split(os.sep)[:2] == ["io", "formats"]:
            continue
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                found += [f"{os.path.relpath(path, os.path.dirname(PACKAGE))}:{n}: {line.strip()}"
                          for n, line in enumerate(f, 1) if _BRANCH.search(line)]
    assert not found, "format-name branches outside batchtool/io/formats/:\n" + "\n".join(found)


@pytest.mark.parametrize("fmt", registry.NAMES)
def test_every_format_counts_and_indexes_its_own_shards(tmp_path, run_cli, parquet_src, fmt):
    """count_rows, inspect_shard and open_batches agree with the manifest the writer recorded, for each format."""
    dst = str(tmp_path / "out")
    assert run_cli("convert", parquet_src, dst, "--to", fmt, "--shard-rows", "120", "-q").exit_code == 0
    dataset = open_dataset(dst)
    spec, output = registry.get(fmt), dataset.manifest["output"]
    entries = output["files"]
    assert [spec.count_rows(dataset, s, ReadReport()) for s in dataset.shards] == [e["rows"] for e in entries]
    # TFRecord records mark batches only by a `batch` column, which convert does not write
    assert [spec.inspect_shard(s.path, dataset.schema, output, True) for s in dataset.shards] == \
        [(e["rows"], e["batches"] if spec.self_indexing else None, None) for e in entries]
    counts, batches = spec.open_batches(dst, dataset)
    assert counts.tolist() == [e["batches"] for e in entries]
    assert [int(batches.rows(f, np.arange(n)).sum()) for f, n in enumerate(counts)] == [e["rows"] for e in entries]
