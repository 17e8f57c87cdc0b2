"""batchtool's Parquet output carries page checksums, and every batchtool reader verifies them."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_parquet_shards

import batchtool
from batchtool.core.errors import InputError
from batchtool.core.synthetic import make_table

COLUMN = "label"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    """Uncompressed convert output (so a flipped byte is a changed value, not a decompression error)
    of 13 row groups, that every command can take as input."""
    from batchtool.cli import cli
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("checksums")
    src = write_parquet_shards(str(root / "src"), make_table(200, seed=9), shards=1, row_group_size=16)
    dst = str(root / "dst")
    result = CliRunner().invoke(cli, ["convert", src, dst, "--compression", "none", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert pq.ParquetFile(os.path.join(dst, "part-00000.parquet")).metadata.num_row_groups == 13
    return dst


def page_byte(path: str, row_group: int, column: str) -> int:
    """An offset inside a page's values: the dictionary page's last byte (a dictionary entry) if the
    chunk has one, else the chunk's last byte (the last value of its last data page)."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    if chunk.has_dictionary_page:
        return chunk.data_page_offset - 1
    return chunk.data_page_offset + chunk.total_compressed_size - 1


@pytest.fixture
def flipped(tmp_path, written) -> Path:
    """A copy of the output with one bit of row group 3's label column flipped."""
    dst = Path(shutil.copytree(written, tmp_path / "dst"))
    path = dst / "part-00000.parquet"
    data = bytearray(path.read_bytes())
    data[page_byte(str(path), 3, COLUMN)] ^= 0x04
    path.write_bytes(bytes(data))
    return dst


def test_every_column_chunk_is_checksummed(written):
    """A flipped byte in any column chunk of any row group is caught (a page without a CRC would not be)."""
    path = os.path.join(written, "part-00000.parquet")
    data = Path(path).read_bytes()
    meta = pq.ParquetFile(path).metadata
    for rg in range(0, meta.num_row_groups, 4):
        for i in range(meta.num_columns):
            leaf = meta.row_group(rg).column(i).path_in_schema
            damaged = bytearray(data)
            damaged[page_byte(path, rg, leaf)] ^= 0x04
            pf = pq.ParquetFile(pa.BufferReader(bytes(damaged)), page_checksum_verification=True)
            with pytest.raises(OSError, match="CRC checksum verification failed"):
                pf.read_row_group(rg, columns=[leaf.split(".")[0]])


def test_without_verification_the_flip_is_a_silently_changed_value(written, flipped):
    """What batchtool used to do: the control that makes the tests below mean something."""
    original = pq.read_table(os.path.join(written, "part-00000.parquet"))
    damaged = pq.ParquetFile(flipped / "part-00000.parquet", page_checksum_verification=False).read()
    assert damaged.num_rows == original.num_rows
    assert damaged.column(COLUMN) != original.column(COLUMN)


ERROR = re.compile(r"^error: .*part-00000\.parquet, row group 3, column 'label': corrupt \(a page checksum does "
                   r"not match: the file changed after it was written\)$")


@pytest.mark.parametrize("args", [
    ("inspect", "{dst}"),
    ("check", "{dst}", "--num-classes", "4"),
    ("convert", "{dst}", "{out}"),
    ("bucket", "{dst}", "{out}", "--boundaries", "10", "--batch-size", "8"),
    ("shuffle", "{dst}", "{out}"),
], ids=lambda a: a[0])
def test_commands_stop_with_one_line_naming_file_row_group_and_column(flipped, tmp_path, run_cli, args):
    before = {p.name: p.read_bytes() for p in flipped.iterdir()}
    out = tmp_path / "out"
    result = run_cli(*(a.format(dst=flipped, out=out) for a in args))
    assert result.exit_code == 2, result.stderr
    assert ERROR.match(result.stderr.strip()), result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert {p.name: p.read_bytes() for p in flipped.iterdir()} == before


def test_load_raises_an_input_error_naming_the_row_group(flipped):
    with pytest.raises(InputError, match=r"part-00000\.parquet, row group 3, column 'label': corrupt \(a page "
                                         r"checksum does not match"):
        list(batchtool.load(str(flipped)))


def test_load_of_other_columns_is_unaffected(flipped, written):
    """Only the damaged pages fail: a projection that does not read them reads the same values."""
    good = [b["weight"].tolist() for b in batchtool.load(written, columns=["weight"])]
    assert [b["weight"].tolist() for b in batchtool.load(str(flipped), columns=["weight"])] == good


def test_parquet_without_checksums_is_still_read(tmp_path, run_cli):
    """Other writers' files rarely have page checksums: verification applies only where they exist."""
    src = write_parquet_shards(str(tmp_path / "src"), make_table(30, seed=2))
    assert pq.ParquetFile(os.path.join(src, "part-00000.parquet")).metadata.num_rows == 15
    result = run_cli("convert", src, tmp_path / "out", "-q")
    assert result.exit_code == 0, result.stderr
