"""Stacked batches: segment's Arrow IPC output stores each work item's consecutive batches as one record batch
(manifest output.stacked_batch_rows), and everything that reads an output hands out exactly the batches of the
same run written one record batch per batch: load in every mode, source, resume, check, inspect; an output of an
older batchtool (one record batch per batch) reads the same; a manifest that lies about the stacks is refused in
one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import record_batches

import batchtool
from batchtool.core.errors import InputError
from batchtool.io import batch_check
from batchtool.io.formats.arrow import FORMAT as ARROW
from batchtool.io.formats.base import Stacked
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.io.output import OutputOptions
from batchtool.loader.arrays import StackViews, views

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "sample_data", "parquet")
B = 16
SEGMENT = ["segment", SAMPLE, "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "20",
           "--batch-size", str(B)]


def _manifest(dst: str) -> dict:
    with open(os.path.join(dst, MANIFEST_NAME)) as f:
        return json.load(f)


def _equal(a: object, b: object) -> bool:
    """Arrays of the same dtype, shape and values (NaN equal to NaN; arrays of objects compared element by element)."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return type(a) is type(b) and a == b
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    if a.dtype == object:
        return all(_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
    return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def _same(left: dict, right: dict, where: str) -> None:
    assert left.keys() == right.keys(), where
    for name in left:
        assert _equal(left[name], right[name]), (where, name, left[name], right[name])


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """The same segment run written stacked (Arrow IPC, uncompressed and lz4), and as Parquet (one row group per
    batch); for one rank and for two."""
    from tests.conftest import invoke_cli

    root = tmp_path_factory.mktemp("stacked")
    made = {}
    for name, extra in {"stacked": [], "parquet": ["--to", "parquet"],
                        "ranks": ["--world-size", "2"], "ranks-parquet": ["--world-size", "2", "--to", "parquet"],
                        "lz4": ["--compression", "lz4"]}.items():
        dst = str(root / name)
        result = invoke_cli(*SEGMENT, dst, *extra)
        assert result.exit_code == 0, result.stderr
        made[name] = dst
    return made


def test_segment_writes_stacks_and_says_so(outputs):
    manifest = _manifest(outputs["stacked"])
    output = manifest["output"]
    assert manifest["manifest_version"] == 3 and output["stacked_batch_rows"] == B
    entry = output["files"][0]
    reader = pa.ipc.open_file(os.path.join(outputs["stacked"], entry["path"]))
    rows = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
    assert entry["record_batches"] == reader.num_record_batches < entry["batches"]
    assert sum(r // B for r in rows) == entry["batches"] and all(r % B == 0 for r in rows)
    # formats that store batches apart get them apart, and say nothing of stacks
    assert "stacked_batch_rows" not in _manifest(outputs["parquet"])["output"]
    assert _manifest(outputs["parquet"])["manifest_version"] == 1


@pytest.mark.parametrize("options", [{}, {"writable": False}, {"verify": False}, {"threads": 1},
                                     {"columns": ["key", "tokens", "sequence"]}])
def test_load_hands_out_the_batches_written_apart(outputs, options):
    stacked, apart = (list(batchtool.load(outputs[name], **options)) for name in ("stacked", "parquet"))
    assert len(stacked) == len(apart) == _manifest(outputs["stacked"])["output"]["batches"]
    for i, (a, b) in enumerate(zip(stacked, apart)):
        _same(a, b, f"batch {i}")


def test_every_rank_reads_its_lanes_as_written_apart(outputs):
    for rank in (0, 1):
        got = list(batchtool.load(outputs["ranks"], rank=rank, world_size=2))
        want = list(batchtool.load(outputs["ranks-parquet"], rank=rank, world_size=2))
        assert len(got) == len(want) > 0
        for i, (a, b) in enumerate(zip(got, want)):
            _same(a, b, f"rank {rank}, batch {i}")


def test_compressed_stacks_read_the_same(outputs):
    for i, (a, b) in enumerate(zip(batchtool.load(outputs["lz4"]), batchtool.load(outputs["parquet"]))):
        _same(a, b, f"batch {i}")


def test_record_batches_source_and_resume_address_batches_not_stacks(outputs):
    stacked, apart = outputs["stacked"], outputs["parquet"]
    for a, b in zip(batchtool.load(stacked).record_batches(), batchtool.load(apart).record_batches()):
        assert a.equals(b)
    source, reference = batchtool.source(stacked), batchtool.source(apart)
    assert len(source) == len(reference)
    for i in (0, 1, 5, len(source) - 1, 3, 2):  # inside one stack, across stacks, backwards
        _same(source[i], reference[i], f"source[{i}]")
    loader = batchtool.load(stacked)
    iterator = iter(loader)
    for _ in range(7):  # stop inside a stack
        next(iterator)
    state = loader.state_dict()
    resumed = batchtool.load(stacked)
    resumed.load_state_dict(state)
    rest = list(resumed)
    whole = list(batchtool.load(apart))
    assert len(rest) == len(whole) - 7
    for i, (a, b) in enumerate(zip(rest, whole[7:])):
        _same(a, b, f"resumed batch {i}")


def test_a_stack_is_made_into_arrays_once_whichever_read_gives_it(outputs, monkeypatch):
    """batchtool.source reads one batch a call and the loader a group of batches a read: the batches of one stack
    after the first reuse its arrays (strings, made a row at a time, are made for the batch alone)."""
    from batchtool.loader import arrays

    made = []
    original = arrays._made
    monkeypatch.setattr(arrays, "_made", lambda *a, **k: made.append(k.get("numbers_only")) or original(*a, **k))
    source = batchtool.source(outputs["stacked"])
    per_stack = pa.ipc.open_file(os.path.join(outputs["stacked"], "part-00000.arrow")).get_batch(0).num_rows // B
    for i in range(per_stack + 1):
        source[i]
    assert made.count(True) == 2  # the first stack, then the second
    made.clear()
    batches = sum(1 for _ in batchtool.load(outputs["stacked"]))
    assert made.count(True) == _manifest(outputs["stacked"])["output"]["files"][0]["record_batches"] < batches


def test_check_counts_batches_not_record_batches(outputs, run_cli):
    result = run_cli("check", outputs["stacked"])
    assert result.exit_code == 0, result.output
    batches = _manifest(outputs["stacked"])["output"]["batches"]
    assert f"manifest_batches  PASS    {batches:,} batches in 1 file, as listed" in result.output


def test_a_damaged_stack_is_named_by_its_record_batch(outputs, tmp_path, run_cli):
    dst = str(tmp_path / "damaged")
    shutil.copytree(outputs["stacked"], dst)
    path = os.path.join(dst, "part-00000.arrow")
    with pa.memory_map(path) as mapped:
        stack = pa.ipc.open_file(mapped).get_batch(1)
        mapped.seek(0)  # (a mapped read's buffers are the file's bytes: where one lies is where it is in the file)
        at = stack.column(stack.schema.get_field_index("length")).buffers()[1].address - \
            mapped.read_buffer(mapped.size()).address
    with open(path, "r+b") as f:
        f.seek(at)
        value = f.read(1)
        f.seek(at)
        f.write(bytes([value[0] ^ 0xFF]))
    with pytest.raises(InputError, match=r"part-00000\.arrow, record batch 1: .*CRC32C"):
        list(batchtool.load(dst))
    assert run_cli("check", dst).exit_code == 1


def _rewrite_manifest(src: str, dst: str, change) -> str:
    shutil.copytree(src, dst)
    manifest = _manifest(dst)
    change(manifest)
    with open(os.path.join(dst, MANIFEST_NAME), "w") as f:
        json.dump(manifest, f)
    return dst


@pytest.mark.parametrize("change,message", [
    (lambda m: m["output"].update(stacked_batch_rows=B + 1),
     r"record batch 0: [\d,]+ rows, not a whole number of the 17-row batches"),
    (lambda m: m["output"].update(stacked_batch_rows="16"), r"stacked_batch_rows is '16', expected a positive count"),
    (lambda m: m["output"].update(stacked_batch_rows=0), r"stacked_batch_rows is 0, expected a positive count"),
    (lambda m: m["output"]["files"][0].update(record_batches=2), r"record batches, but .* lists 2"),
    (lambda m: (m["output"]["files"][0].update(batches=m["output"]["files"][0]["batches"] - 1),
                m["output"].update(batches=m["output"]["batches"] - 1)), r"[\d,]+ batches, but .* lists"),
    (lambda m: m["output"].pop("stacked_batch_rows"), r"record batches, but .* lists"),
])
def test_a_manifest_that_lies_about_stacks_is_refused(outputs, tmp_path, change, message):
    dst = _rewrite_manifest(outputs["stacked"], str(tmp_path / "lied"), change)
    with pytest.raises(InputError, match=message):
        list(batchtool.load(dst))


def test_a_stacked_manifest_on_other_formats_is_refused(outputs, tmp_path):
    dst = _rewrite_manifest(outputs["parquet"], str(tmp_path / "lied"),
                            lambda m: m["output"].update(stacked_batch_rows=B))
    with pytest.raises(InputError, match=r"stacked_batch_rows is 16, expected .* that stores stacks \(Arrow IPC\)"):
        batchtool.load(dst)


def test_an_output_of_one_record_batch_per_batch_still_reads(outputs, tmp_path):
    """What batchtool wrote before stacks (manifest version 1, a record batch per batch) reads as it did."""
    dst = tmp_path / "old"
    dst.mkdir()
    manifest = _manifest(outputs["stacked"])
    options = OutputOptions(format="arrow")
    for entry in manifest["output"]["files"]:
        reader = pa.ipc.open_file(os.path.join(outputs["stacked"], entry["path"]))
        with open(dst / entry["path"], "wb") as f:
            sink = ARROW.open_sink(f, reader.schema, options)
            for r in range(reader.num_record_batches):
                stack = reader.get_batch(r)
                for start in range(0, stack.num_rows, B):
                    sink.write(ARROW.encode(stack.slice(start, B), options))
            extra = sink.close()
        entry.update(extra, bytes=os.path.getsize(dst / entry["path"]))
        entry.pop("record_batches")
        with open(dst / entry["path"], "rb") as f:
            entry["sha256"] = hashlib.sha256(f.read()).hexdigest()
    manifest["manifest_version"] = 1
    del manifest["output"]["stacked_batch_rows"], manifest["output"]["index"]
    manifest["output"]["bytes"] = sum(e["bytes"] for e in manifest["output"]["files"])
    with open(dst / MANIFEST_NAME, "w") as f:
        json.dump(manifest, f)
    for i, (a, b) in enumerate(zip(batchtool.load(str(dst)), batchtool.load(outputs["parquet"]), strict=True)):
        _same(a, b, f"batch {i}")


def _stack() -> tuple[pa.RecordBatch, list[Stacked]]:
    """Three batches of 2 rows stacked, whose columns convert alike stacked or apart only in some batches: a null
    in one batch only, list lengths equal within a batch but not across, booleans, strings with a null."""
    stack = pa.RecordBatch.from_pydict({
        "dense": pa.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 0], [1, 1]], pa.list_(pa.int32())),
        "per_batch": pa.array([[1], [2], [3, 4], [5, 6], [7], [8]], pa.list_(pa.int64())),
        "null_once": pa.array([1, 2, None, 4, 5, 6], pa.int64()),
        "inner_null": pa.array([[1.0], [2.0], [None], [4.0], [5.0], [6.0]], pa.list_(pa.float32())),
        "flag": pa.array([True, False, True, True, False, False]),
        "name": pa.array(["a", None, "c", "d", "e", "f"]),
        "fixed": pa.array([[1, 2]] * 6, pa.list_(pa.int16(), 2)),
    })
    return stack, [Stacked(stack, i, 2) for i in range(3)]


@pytest.mark.parametrize("writable", [False, True])
def test_stack_views_are_the_views_of_each_batch_alone(writable):
    stack, pieces = _stack()
    made = StackViews(writable, unsliced=False)
    for piece in pieces:
        _same(made(piece), views(piece.batch, writable), f"batch {piece.index}")


@settings(max_examples=150, deadline=None)
@given(batch=record_batches(max_columns=5), rows=st.integers(1, 5), writable=st.booleans())
def test_any_stack_hands_out_what_each_batch_alone_converts_to(batch, rows, writable):
    """Whatever the columns (nulls in some batches only, lists of equal lengths within a batch but not across,
    nested and fixed-size lists, strings, booleans), a batch of a stack read back from Arrow IPC converts as the
    same rows stored alone."""
    rows = max(1, min(rows, batch.num_rows))
    batch = batch.slice(0, batch.num_rows - batch.num_rows % rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    stack = pa.ipc.open_file(sink.getvalue()).get_batch(0)  # (as a read gives it: every array at offset 0)
    made = StackViews(writable, unsliced=True)
    for index in range(batch.num_rows // rows):
        piece = Stacked(stack, index, rows)
        _same(made(piece), views(piece.batch, writable), f"batch {index}")


def test_checksum_of_a_stack_covers_every_batch_in_it():
    stack, _ = _stack()
    encoded = ARROW.encode(stack, OutputOptions(format="arrow"))
    assert encoded.metadata == batch_check.batch_crc_metadata(stack)
