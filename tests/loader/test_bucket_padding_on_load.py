"""`bucket --padding on-load`: batches stored at their real lengths, and batchtool.load / batchtool.source handing
out exactly the arrays the padded storage gives; the manifest's record of it and the errors of a damaged one."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchtool
from memlimit import HANG_GUARD
from batchtool.io import manifest_reader
from batchtool.core.errors import InputError
from batchtool.io.load_padding import LoadPadding
from batchtool.io.manifest import MANIFEST_NAME
import memlimit
from conftest import REPO, invoke_cli, read_dir, write_parquet_shards

OPTIONS = ("--boundaries", "20,40", "--batch-size", "8", "-q")


def assert_same_batches(expected: list[dict], found: list[dict]) -> None:
    """Batch for batch: the same columns in the same order, each array of the same dtype, shape, values and
    writability (object arrays of per-row arrays compared row by row)."""
    assert len(expected) == len(found) > 0
    for want, got in zip(expected, found):
        assert list(want) == list(got)
        for name in want:
            a, b = want[name], got[name]
            assert (a.dtype, a.shape, a.flags.writeable) == (b.dtype, b.shape, b.flags.writeable), name
            if a.dtype == object:
                assert all(same(x, y) for x, y in zip(a, b)), name
            else:
                assert same(a, b), name


def same(a: object, b: object) -> bool:
    """Equal values (a null float step is NaN on both sides), for arrays or an object array's items."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return a == b


def bucket_both(src: str, root: str, *options: object) -> dict[str, str]:
    """SRC bucketed with the same options, padded (stored) and unpadded (on-load): padding -> DST."""
    out = {}
    for padding in ("stored", "on-load"):
        out[padding] = os.path.join(root, padding)
        result = invoke_cli("bucket", src, out[padding], *options, "--padding", padding)
        assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("to", ["arrow", "parquet", "tfrecord"])
@pytest.mark.parametrize("extra", [(), ("--pad-to-boundary", "--mask", "--pad-value", "tokens=-1",
                                        "--pad-value", "frames=2.5")], ids=["dynamic", "boundary-mask-values"])
def test_load_and_source_give_the_arrays_of_padded_storage(tmp_path, parquet_src, to, extra):
    dst = bucket_both(parquet_src, str(tmp_path), *OPTIONS, "--to", to, *extra)
    for writable in (True, False):
        padded = list(batchtool.load(dst["stored"], shuffle=False, writable=writable))
        assert_same_batches(padded, list(batchtool.load(dst["on-load"], shuffle=False, writable=writable)))
        source = batchtool.source(dst["on-load"], writable=writable)
        assert_same_batches(padded, [source[i] for i in range(len(source))])
    assert padded[0]["frames"].ndim == 3 and padded[0]["tokens"].shape == padded[0]["frames"].shape[:2]
    shuffled = [list(batchtool.load(d, seed=3, writable=False)) for d in (dst["stored"], dst["on-load"])]
    assert_same_batches(*shuffled)


def test_columns_asked_mask_alone_and_record_batches(tmp_path, parquet_src):
    dst = bucket_both(parquet_src, str(tmp_path), *OPTIONS, "--mask")
    for columns in (["mask"], ["frames", "mask", "label"], ["length", "tokens"]):
        loaders = [batchtool.load(d, columns=columns, shuffle=False) for d in (dst["stored"], dst["on-load"])]
        assert loaders[0].schema == loaders[1].schema and loaders[1].schema.names == columns
        assert_same_batches(*(list(loader) for loader in loaders))
    stored, on_load = (list(batchtool.load(d, shuffle=False).record_batches()) for d in dst.values())
    assert all(a.equals(b) for a, b in zip(stored, on_load)) and len(stored) == len(on_load)
    with pytest.raises(InputError, match="no column 'masks'"):
        batchtool.load(dst["on-load"], columns=["masks"])


def test_stored_batches_hold_the_real_steps_and_the_manifest_says_how_to_pad(tmp_path, parquet_src, corpus):
    dst = bucket_both(parquet_src, str(tmp_path), *OPTIONS, "--mask", "--pad-to-boundary")
    table = read_dir(dst["on-load"])  # as pyarrow, not batchtool, reads it
    assert "mask" not in table.schema.names and "mask" in read_dir(dst["stored"]).schema.names
    assert pc.list_value_length(table["tokens"]).to_pylist() == table["length"].to_pylist()
    assert sorted(table["key"].to_pylist()) == sorted(corpus["key"].to_pylist())
    manifest = json.loads((tmp_path / "on-load" / MANIFEST_NAME).read_text())
    assert manifest["manifest_version"] == 2 and manifest["options"]["padding"] == "on-load"
    assert manifest["output"]["padding"] == {"sequences": ["tokens", "frames"], "pad_values": [],
                                             "pad_to": [19, 39, None], "length": "length", "bucket": "bucket",
                                             "mask": "mask"}
    padded = json.loads((tmp_path / "stored" / MANIFEST_NAME).read_text())
    assert padded["manifest_version"] == 1 and "padding" not in padded["output"]
    assert "padding" not in padded["options"]
    assert padded["stats"] == manifest["stats"]  # the padding done, whoever does it
    assert os.path.getsize(tmp_path / "on-load" / "part-00000.arrow") < \
        os.path.getsize(tmp_path / "stored" / "part-00000.arrow")
    said = "stored unpadded (bucket --padding on-load): batchtool.load pads each batch as it reads it"
    assert said in invoke_cli("inspect", dst["on-load"]).output
    assert said not in invoke_cli("inspect", dst["stored"]).output


def test_a_batchtool_that_reads_only_version_1_refuses_on_load_output(tmp_path, parquet_src, monkeypatch):
    dst = bucket_both(parquet_src, str(tmp_path), *OPTIONS)
    monkeypatch.setattr(manifest_reader, "FORMAT_VERSION", 1)
    assert manifest_reader.read_manifest(dst["stored"])["manifest_version"] == 1
    with pytest.raises(InputError, match="manifest_version 2 was written by a newer batchtool"):
        manifest_reader.read_manifest(dst["on-load"])


@pytest.mark.parametrize("field, value, message", [
    ("sequences", ["nope"], "output.padding.sequences is \\['nope'\\], expected a list of the output's list columns"),
    ("sequences", ["key"], "output.padding.sequences"),
    ("length", "tokens", "output.padding.length is 'tokens', expected an integer column"),
    ("mask", "label", "output.padding.mask is 'label', expected null or a column name the output does not hold"),
    ("pad_to", [1e12, None, None], "output.padding.pad_to"),
    ("pad_to", [], "output.padding.pad_to"),
    ("pad_values", ["tokens=x"], "output.padding.pad_values: .*'x' is not a int64 value"),
])
def test_a_damaged_padding_record_is_one_error_line(tmp_path, parquet_src, run_cli, field, value, message):
    dst = bucket_both(parquet_src, str(tmp_path), *OPTIONS)["on-load"]
    path = os.path.join(dst, MANIFEST_NAME)
    manifest = json.load(open(path))
    manifest["output"]["padding"][field] = value
    json.dump(manifest, open(path, "w"))
    with pytest.raises(InputError, match=message):
        batchtool.load(dst)
    result = run_cli("inspect", dst)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "output.padding" in result.stderr


def test_a_batch_whose_lengths_disagree_with_its_steps_is_refused_naming_row_and_column():
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("bucket", pa.int32()), ("length", pa.int32())])
    padding = LoadPadding.of({"sequences": ["tokens"], "pad_values": [], "pad_to": [None, 5], "length": "length",
                              "bucket": "bucket", "mask": None}, schema, "m.json")
    ok = pa.record_batch([pa.array([[1, 2], [3]]), pa.array([0, 0], pa.int32()), pa.array([2, 1], pa.int32())],
                         schema=schema)
    assert padding.pad(ok, None, lambda: "f, batch 0").column("tokens").to_pylist() == [[1, 2], [3, 0]]
    assert padding.pad(ok.set_column(1, "bucket", pa.array([1, 1], pa.int32())), ["tokens"],
                       lambda: "f").column(0).to_pylist() == [[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]]
    cases = {"row 1, column 'tokens': corrupt \\(1 steps, column 'length' says 4\\)":
             ok.set_column(2, "length", pa.array([2, 4], pa.int32())),
             "column 'bucket': corrupt": ok.set_column(1, "bucket", pa.array([0, 2], pa.int32())),
             "column 'length': corrupt \\(a row of 2 steps in a batch of 1 rows padded to 1\\)":
             pa.record_batch([pa.array([[1, 2]]), pa.array([1], pa.int32()), pa.array([2], pa.int32())],
                             schema=schema)}
    padding = LoadPadding.of({"sequences": ["tokens"], "pad_values": [], "pad_to": [None, 1], "length": "length",
                              "bucket": "bucket", "mask": None}, schema, "m.json")
    for message, batch in cases.items():
        with pytest.raises(InputError, match="^f, batch 0, " + message):
            padding.pad(batch, None, lambda: "f, batch 0")


PAD_TO_BOMB = """
import pyarrow as pa
from batchtool.core.errors import InputError
from batchtool.io.load_padding import LoadPadding
schema = pa.schema([("frames", pa.list_(pa.list_(pa.float32(), 16))), ("bucket", pa.int32()), ("length", pa.int32())])
padding = LoadPadding.of({"sequences": ["frames"], "pad_values": [], "pad_to": [(1 << 30) // 64], "length": "length",
                          "bucket": "bucket", "mask": None}, schema, "m.json")
batch = pa.record_batch([pa.array([[[0.0] * 16]] * 64, schema.field(0).type), pa.array([0] * 64, pa.int32()),
                         pa.array([1] * 64, pa.int32())], schema=schema)
try:
    padding.pad(batch, None, lambda: "f, batch 0")
except InputError as exc:
    print(exc)
"""


def test_a_manifest_padded_length_cannot_make_load_allocate_what_it_asks():
    """pad_to comes from the manifest: 64 rows of 2**24 steps of 16 floats would be 64 GiB. Refused from the
    arithmetic alone, in a child capped at 300 MB that would die allocating it."""
    capped = memlimit.run_capped([sys.executable, "-c", PAD_TO_BOMB], 300 << 20, env={**os.environ, "PYTHONPATH": REPO})
    assert not capped.killed_for_memory and capped.returncode == 0, capped
    assert capped.stdout.startswith("f, batch 0, column 'frames': padding 64 rows to 16,777,216 steps would take "
                                    "65,536 MiB, more than a batch padded on load may (512 MiB)"), capped.stdout


READ_AHEAD = """
import importlib, itertools, sys, batchtool
importlib.import_module("batchtool.loader.load").READ_AHEAD_PADDED_BYTES = 32 << 20  # (batchtool.load is the function)
loader = batchtool.load(sys.argv[1], threads=4, seed=1)
print({b["tokens"].shape[1] for b in itertools.islice(loader, 31)})
"""


def test_load_bounds_the_padded_batches_of_its_whole_read_ahead(tmp_path, parquet_src, run_cli):
    """A manifest padded length that makes each batch 8 MiB (far below the one-batch bound): the reading threads
    would pad 31 such batches ahead of the loop (groups of 1, 2, 4, 8 and 16 in flight), 250 MiB; they stop at
    READ_AHEAD_PADDED_BYTES (here 32 MiB) and the loop pads the rest as it takes them. A child capped at 300 MB
    (pyarrow and NumPy take 150) reads 31 batches."""
    dst = tmp_path / "out"
    assert run_cli("bucket", parquet_src, dst, "--boundaries", "20,40", "--batch-size", "4", "--padding", "on-load",
                   "--to", "arrow", "-q").exit_code == 0
    path = os.path.join(dst, MANIFEST_NAME)
    manifest = json.load(open(path))
    steps = (8 << 20) // (4 * (8 + 12))  # 4 rows, int64 tokens and 3 float32 frames a step
    manifest["output"]["padding"]["pad_to"] = [steps] * 3
    json.dump(manifest, open(path, "w"))
    assert sum(e["batches"] for e in manifest["output"]["files"]) >= 31
    capped = memlimit.run_capped([sys.executable, "-c", READ_AHEAD, str(dst)], 300 << 20,
                                 env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)
    assert not capped.killed_for_memory and capped.returncode == 0, capped
    assert capped.stdout.split() == [f"{{{steps}}}"]


def test_a_huge_string_pad_value_is_refused_naming_the_file_batch_and_column(tmp_path):
    """A pad value of 10 MB for a list<string> column: each pad step would copy it (an ArrowCapacityError past
    2 GiB of strings, memory long before): refused from the arithmetic, one InputError."""
    table = pa.table({"words": pa.array([["a"] * n for n in (3, 5, 200, 300)], pa.list_(pa.string())),
                      "label": pa.array([0, 1, 0, 1])})
    src = write_parquet_shards(str(tmp_path / "src"), table)
    dst = tmp_path / "out"
    assert invoke_cli("bucket", src, dst, "--length", "words", "--boundaries", "10", "--batch-size", "2",
                      "--pad-value", "words=<pad>", "--padding", "on-load", "--to", "arrow", "-q").exit_code == 0
    path = os.path.join(dst, MANIFEST_NAME)
    manifest = json.load(open(path))
    manifest["output"]["padding"]["pad_values"] = ["words=" + "x" * 10**7]
    json.dump(manifest, open(path, "w"))
    for read in (lambda: list(batchtool.load(dst, shuffle=False)), lambda: batchtool.source(dst)[1]):
        with pytest.raises(InputError, match=r"^.*part-00000.arrow, batch 1, column 'words': padding 2 rows to 300 "
                                             r"steps with a pad value of 10,000,000 bytes would take 954 MiB, more "
                                             r"than a batch padded on load may \(512 MiB\)"):
            read()


def test_an_unknown_padding_is_one_error_line(tmp_path, parquet_src, run_cli):
    result = run_cli("bucket", parquet_src, tmp_path / "out", *OPTIONS, "--padding", "later")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and "--padding" in result.stderr and "on-load" in result.stderr
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == ["src"]


def test_a_pipeline_bucket_stage_pads_on_load(tmp_path, parquet_src, run_cli):
    stored = tmp_path / "stored"
    assert run_cli("bucket", parquet_src, stored, "--length", "tokens", "--auto-buckets", "3", "--batch-size", "16",
                   "--mask", "-q").exit_code == 0
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[input]\npath = "{parquet_src}"\n[[stage]]\nop = "bucket"\nlength = "tokens"\n'
                        'auto-buckets = 3\nbatch-size = 16\nmask = true\npadding = "on-load"\n'
                        f'[output]\npath = "{tmp_path / "on-load"}"\n')
    result = run_cli("run", pipeline, "-q")
    assert result.exit_code == 0, result.stderr
    assert_same_batches(list(batchtool.load(stored, shuffle=False)),
                        list(batchtool.load(tmp_path / "on-load", shuffle=False)))


LEAVES = {"int64": (pa.int64(), st.integers(-5, 5)), "float32": (pa.float32(), st.floats(-2, 2, width=32)),
          "bool": (pa.bool_(), st.booleans()), "string": (pa.string(), st.text(max_size=3))}


@st.composite
def ragged_tables(draw: st.DrawFn) -> pa.Table:
    """1-24 examples of 0-9 steps: a sequence column of one leaf type (a vector of 2 per step, or scalars; a few
    null steps), a second sequence of the same lengths, and a label."""
    rows = draw(st.integers(1, 24))
    lengths = draw(st.lists(st.integers(0, 9), min_size=rows, max_size=rows))
    leaf, values = LEAVES[draw(st.sampled_from(sorted(LEAVES)))]
    vector = draw(st.booleans())
    step = st.lists(values, min_size=2, max_size=2) if vector else st.one_of(st.none(), values)
    seq = [draw(st.lists(step, min_size=n, max_size=n)) for n in lengths]
    return pa.table({"seq": pa.array(seq, pa.list_(pa.list_(leaf, 2) if vector else leaf)),
                     "pos": pa.array([list(range(n)) for n in lengths], pa.list_(pa.int32())),
                     "label": pa.array(np.arange(rows) % 3)})


@settings(max_examples=12, deadline=None)
@given(table=ragged_tables(), boundary=st.integers(1, 8), to_boundary=st.booleans(), mask=st.booleans(),
       batch=st.integers(1, 5), to=st.sampled_from(["arrow", "parquet"]))
def test_on_load_equals_padded_storage_for_any_ragged_data(table, boundary, to_boundary, mask, batch, to):
    with tempfile.TemporaryDirectory() as root:
        src = write_parquet_shards(os.path.join(root, "src"), table, shards=1, row_group_size=7)
        options = ["--length", "pos", "--boundaries", boundary, "--batch-size", batch, "--to", to, "-q"]
        options += ["--pad-to-boundary"] * to_boundary + ["--mask"] * mask
        dst = bucket_both(src, root, *options)
        for writable in (True, False):
            assert_same_batches(list(batchtool.load(dst["stored"], shuffle=False, writable=writable)),
                                list(batchtool.load(dst["on-load"], shuffle=False, writable=writable)))
