"""`bucket --padding on-load` over two lengths: each sequence stored at its real steps and padded by batchtool.load
and batchtool.source to its own length, exactly as the stored grid output pads it; the manifest's per-sequence
record and the errors of a damaged or hostile one."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pytest

import batchtool
import memlimit
from batchtool.core.errors import InputError
from batchtool.io.load_padding import LoadPadding
from batchtool.io.manifest import MANIFEST_NAME
from conftest import REPO, data_bytes, invoke_cli, write_parquet_shards

GRID = ("--length", "in_len", "--length", "out_len", "--sequence", "src", "--sequence", "tgt", "--auto-buckets", "4",
        "--max-tokens", "400", "-q")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """Input steps lognormal, output about a quarter of them (float frames with a null step, int tokens)."""
    rng = np.random.default_rng(7)
    first = np.clip(rng.lognormal(3.0, 0.5, 80), 1, 120).astype(int)
    second = np.maximum(1, first // 4 + rng.integers(-2, 3, 80))
    frames = [[[float(i + j), None][j % 7 == 6:][:1][0] for j in range(a)] for i, a in enumerate(first)]
    t = pa.table({"id": np.arange(80), "src": pa.array(frames, pa.list_(pa.float32())),
                  "tgt": pa.array([[i] * b for i, b in enumerate(second)], pa.list_(pa.int16())),
                  "in_len": first, "out_len": second})
    return write_parquet_shards(str(tmp_path_factory.mktemp("grid") / "src"), t, shards=2, row_group_size=20)


def bucket_both(src: str, root: str, *options: str) -> dict[str, str]:
    """SRC bucketed over the grid, padded (stored) and unpadded (on-load): padding -> DST."""
    out = {}
    for padding in ("stored", "on-load"):
        out[padding] = os.path.join(root, padding)
        result = invoke_cli("bucket", src, out[padding], *GRID, *options, "--padding", padding)
        assert result.exit_code == 0, result.stderr
    return out


def assert_same(expected: list[dict], found: list[dict]) -> None:
    """Batch for batch, column for column: the same dtype, shape and values (NaN on both sides for a null)."""
    assert len(expected) == len(found) > 0
    for want, got in zip(expected, found):
        assert list(want) == list(got)
        for name in want:
            assert want[name].dtype == got[name].dtype and want[name].shape == got[name].shape, name
            assert np.array_equal(want[name], got[name], equal_nan=want[name].dtype.kind == "f"), name


@pytest.mark.parametrize("extra", [("--to", "arrow"), ("--pad-to-boundary", "--pad-value", "tgt=-1")],
                         ids=["dynamic-arrow", "boundary-parquet"])
def test_load_and_source_pad_each_sequence_as_the_stored_grid(tmp_path, src, extra):
    dst = bucket_both(src, str(tmp_path), *extra)
    padded = list(batchtool.load(dst["stored"], shuffle=False))
    assert_same(padded, list(batchtool.load(dst["on-load"], shuffle=False)))
    source = batchtool.source(dst["on-load"])
    assert_same(padded, [source[i] for i in range(len(source))])
    assert_same(list(batchtool.load(dst["stored"], seed=2, columns=["tgt", "id"])),
                list(batchtool.load(dst["on-load"], seed=2, columns=["tgt", "id"])))
    widths = {(b["src"].shape[1], b["tgt"].shape[1]) for b in padded}
    assert any(s != t for s, t in widths)  # each sequence its own length, not one per batch
    if "--pad-to-boundary" not in extra:
        assert all(b["src"].shape[1] == b["length"].max() and b["tgt"].shape[1] == b["length_2"].max()
                   for b in padded)


def test_the_manifest_records_each_sequences_length_and_the_bytes_do_not_depend_on_threads(tmp_path, src):
    dst = bucket_both(src, str(tmp_path), "--pad-to-boundary", "--threads", "1")["on-load"]
    recorded = json.load(open(os.path.join(dst, MANIFEST_NAME)))["output"]["padding"]
    assert recorded["lengths"] == ["length", "length_2"] and recorded["sequences"] == ["src", "tgt"]
    assert recorded["mask"] is None and len(recorded["pad_to"]) > 1
    assert all(len(cell) == 2 and all(isinstance(p, int) for p in cell) for cell in recorded["pad_to"])
    again = invoke_cli("bucket", src, tmp_path / "two", *GRID, "--pad-to-boundary", "--padding", "on-load",
                       "--threads", "2")
    assert again.exit_code == 0 and data_bytes(dst) == data_bytes(str(tmp_path / "two"))
    dynamic = bucket_both(src, str(tmp_path / "dynamic"))["on-load"]
    assert {tuple(c) for c in json.load(open(os.path.join(dynamic, MANIFEST_NAME)))["output"]["padding"]["pad_to"]} \
        == {(None, None)}


def damage(dst: str, **fields: object) -> None:
    path = os.path.join(dst, MANIFEST_NAME)
    manifest = json.load(open(path))
    manifest["output"]["padding"].update(fields)
    json.dump(manifest, open(path, "w"))


@pytest.mark.parametrize("fields, message", [
    ({"lengths": ["length"]}, "output.padding.lengths is \\['length'\\], expected a list of integer columns"),
    ({"lengths": ["length", "tgt"]}, "output.padding.lengths"),
    ({"pad_to": [[None]] * 4}, "output.padding.pad_to .*each a list of 2, one per sequence"),
    ({"pad_to": [None] * 4}, "output.padding.pad_to"),
    ({"pad_to": [[1, 1 << 31]] * 4}, "output.padding.pad_to"),
    ({"mask": "mask"}, "output.padding.mask is 'mask', expected null with per-sequence lengths"),
])
def test_a_damaged_per_sequence_record_is_one_error_line(tmp_path, src, run_cli, fields, message):
    dst = str(tmp_path / "out")
    assert invoke_cli("bucket", src, dst, *GRID, "--padding", "on-load").exit_code == 0
    damage(dst, **fields)
    with pytest.raises(InputError, match=message):
        batchtool.load(dst)
    result = run_cli("inspect", dst)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "output.padding" in result.stderr


def test_a_second_length_too_short_for_its_rows_is_refused_naming_file_batch_and_column(tmp_path, src):
    dst = str(tmp_path / "out")
    assert invoke_cli("bucket", src, dst, *GRID, "--padding", "on-load", "--to", "arrow").exit_code == 0
    cells = len(json.load(open(os.path.join(dst, MANIFEST_NAME)))["output"]["padding"]["pad_to"])
    damage(dst, pad_to=[[None, 1]] * cells)
    for read in (lambda: list(batchtool.load(dst, shuffle=False)), lambda: batchtool.source(dst)[0]):
        with pytest.raises(InputError, match=r"part-00000.arrow, batch 0, column 'length_2': corrupt \(a row of \d+ "
                                             r"steps in a batch of \d+ rows padded to 1\)"):
            read()


GRID_BOMB = """
import pyarrow as pa
from batchtool.core.errors import InputError
from batchtool.io.load_padding import LoadPadding
schema = pa.schema([("src", pa.list_(pa.list_(pa.float32(), 16))), ("tgt", pa.list_(pa.int64())),
                    ("bucket", pa.int32()), ("length", pa.int32()), ("length_2", pa.int32())])
padding = LoadPadding.of({"sequences": ["src", "tgt"], "pad_values": [], "pad_to": [[None, (1 << 31) // 64 - 1]],
                          "length": "length", "bucket": "bucket", "mask": None, "lengths": ["length", "length_2"]},
                         schema, "m.json")
ones = pa.array([1] * 64, pa.int32())
zeros = pa.array([0] * 64, pa.int32())
batch = pa.record_batch([pa.array([[[0.0] * 16]] * 64, schema.field(0).type),
                         pa.array([[1]] * 64, schema.field(1).type), zeros, ones, ones], schema=schema)
for measure in (lambda: padding.padded_bytes(batch, lambda: "f, batch 0"),
                lambda: padding.pad(batch, None, lambda: "f, batch 0")):
    try:
        measure()
    except InputError as exc:
        print(exc)
"""


def test_a_hostile_second_length_cannot_make_load_allocate_what_it_asks():
    """The second sequence's padded length from the manifest: 64 rows of 33,554,431 int64 steps would be 16 GiB.
    Refused from the arithmetic alone (for the read-ahead's measure and the pad), in a child capped at 300 MB."""
    capped = memlimit.run_capped([sys.executable, "-c", GRID_BOMB], 300 << 20, env={**os.environ, "PYTHONPATH": REPO})
    assert not capped.killed_for_memory and capped.returncode == 0, capped
    lines = capped.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(
        "f, batch 0, column 'tgt': padding 64 rows to 33,554,431 steps would take 16,384 MiB, more than a batch "
        "padded on load may (512 MiB)") for line in lines), capped.stdout


def test_each_sequence_is_padded_to_its_own_length_and_measured_so():
    schema = pa.schema([("a", pa.list_(pa.int32())), ("b", pa.list_(pa.int8())), ("bucket", pa.int32()),
                        ("length", pa.int32()), ("length_2", pa.int32())])
    padding = LoadPadding.of({"sequences": ["a", "b"], "pad_values": ["b=-1"], "pad_to": [[None, None], [4, 6]],
                              "length": "length", "bucket": "bucket", "mask": None,
                              "lengths": ["length", "length_2"]}, schema, "m.json")
    batch = pa.record_batch([pa.array([[1, 2], [3]]), pa.array([[5], [6, 7, 8]], pa.list_(pa.int8())),
                             pa.array([0, 0], pa.int32()), pa.array([2, 1], pa.int32()), pa.array([1, 3], pa.int32())],
                            schema=schema)
    out = padding.pad(batch, None, lambda: "f")
    assert out.column("a").to_pylist() == [[1, 2], [3, 0]] and out.column("b").to_pylist() == [[5, -1, -1], [6, 7, 8]]
    assert padding.padded_bytes(batch, lambda: "f") == 2 * 2 * 4 + 2 * 3 * 1
    cell = batch.set_column(2, "bucket", pa.array([1, 1], pa.int32()))
    assert padding.pad(cell, ["b"], lambda: "f").column(0).to_pylist() == [[5, *[-1] * 5], [6, 7, 8, -1, -1, -1]]
    assert padding.padded_bytes(cell, lambda: "f") == 2 * 4 * 4 + 2 * 6 * 1
    with pytest.raises(InputError, match=r"^f, row 0, column 'b': corrupt \(1 steps, column 'length_2' says 2\)"):
        padding.pad(batch.set_column(4, "length_2", pa.array([2, 3], pa.int32())), None, lambda: "f")
