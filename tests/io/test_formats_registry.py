"""The format registry: every format is found by name and suffix (Arrow also by magic), and checks its own options."""

from __future__ import annotations

import os
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import batchtool
from batchtool.io.dataset import ReadReport
from batchtool.core.errors import UsageError
from batchtool.io.formats import registry
from batchtool.io.inputs import detect_format, open_dataset
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.io.output import OutputOptions
from cli_help import batchtool_env
from conftest import read_dir
from memlimit import HANG_GUARD


def test_registry_names_and_detection_by_name():
    assert registry.NAMES == ("parquet", "tfrecord", "arrow")
    assert [registry.detect(p) for p in ("a/x.parquet", "x.PQ", "x.tfrecord.gz", "x.tfrec", "x.arrow", "x.ipc",
                                        "x.json", ".batchtool_manifest.json")] == \
        ["parquet", "parquet", "tfrecord", "tfrecord", "arrow", "arrow", None, None]


def test_each_format_module_is_imported_when_its_format_is_asked_for():
    """The registry lists every format by name without importing one; asking for one imports its modules alone (Arrow
    IPC: the format, and its files opened to read), whose FORMAT is the format of that name."""
    assert [name for name, spec in registry.FORMATS.items() if spec.name != name] == []
    child = ("import json, sys\nfrom batchtool.io.formats import registry\n"
             "def formats(): return sorted(m for m in sys.modules if m.startswith(('batchtool.io.formats.parquet', "
             "'batchtool.io.formats.arrow', 'batchtool.io.formats.tfrecord', 'batchtool.io.formats.example')))\n"
             "before = formats()\nspec = registry.get('arrow')\n"
             "print(json.dumps([registry.NAMES, registry.DEFAULT, before, formats()]))")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=batchtool_env(),
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [["parquet", "tfrecord", "arrow"], "parquet", [],
                                       ["batchtool.io.formats.arrow", "batchtool.io.formats.arrow_files"]]


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


def test_a_new_input_format_is_one_module_and_one_registry_line(tmp_path, monkeypatch, run_cli):
    """docs/internals.md's walkthrough: tests/io/jsonl_format.py, registered in one line, is read by a command."""
    from jsonl_format import JsonLinesReader

    monkeypatch.setitem(registry.FORMATS, JsonLinesReader.name, JsonLinesReader())  # the one registry line
    # undeclared (io/formats/declared.py): listed by asking the format itself; a Reader alone, which --to refuses
    assert registry.format_labels() == "Parquet, TFRecord, Arrow IPC or JSON Lines"
    assert registry.suffixes().endswith("or .jsonl") and "jsonl" not in registry.written()
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": 1, "name": "x"}\n{"id": 2, "name": "y"}\n')
    (src / "b.jsonl").write_text('{"id": 3, "name": "z"}\n')
    result = run_cli("convert", src, tmp_path / "out", "--columns", "name,id")
    assert result.exit_code == 0, result.stderr
    assert read_dir(str(tmp_path / "out")).to_pydict() == {"name": ["x", "y", "z"], "id": [1, 2, 3]}
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["inputs"]["format"] == "jsonl" and len(manifest["inputs"]["files"]) == 2
    assert manifest["inputs"]["tfrecord_kind"] is None  # (every manifest has one shape: base.RECORDED_OPTIONS)
    (src / "b.jsonl").write_text('{"id": 3, "name": "z"}\nnot json\n')
    result = run_cli("convert", src, tmp_path / "again")
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {src / 'b.jsonl'}: not JSON Lines (")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "again").exists()
    with pytest.raises(UsageError, match="--to 'jsonl': expected parquet, tfrecord or arrow"):
        OutputOptions(format="jsonl")
