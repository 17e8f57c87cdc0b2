"""No byte of an Arrow IPC shard or of a manifest can crash batchtool.load or make it allocate without bound: each
mutation is read in a memory-capped child process, which ends normally with every batch (the right values when
verify=True), or with one BatchtoolError naming the file; never by a signal."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest
from conftest import write_parquet_shards
from ipc_bombs import write_bomb
from load_outputs import QUIET, manifest_file, segment_output
from memlimit import HANG_GUARD, run_capped

import batchtool
from batchtool.exec.driver import run_operation
from batchtool.core.errors import InputError, UsageError
from batchtool.io.formats import ipc_meta
from batchtool.ops.bucket import OP, BucketOptions
from batchtool.ops.shuffle import OP as SHUFFLE
from batchtool.ops.shuffle import ShuffleOptions
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import make_table

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(HERE)
CAP = 600 << 20
"""The child's resident memory at most: Python, NumPy and pyarrow take ~150 MB; the outputs are a few hundred KB."""
MUTATIONS = 10
"""Single-byte mutations per (output, byte class), each read twice (with and without verify)."""


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """Arrow IPC bucket output whose `weight` column has nulls (so its batches have validity bitmaps), and
    segment output (strings, nested lists)."""
    root = str(tmp_path_factory.mktemp("fuzz"))
    table = make_table(120, seed=7)
    weight = pa.array([None if i % 3 == 0 else w for i, w in enumerate(table.column("weight").to_pylist())],
                      pa.float32())
    src = write_parquet_shards(os.path.join(root, "src"), table.set_column(2, "weight", weight))
    bucket = os.path.join(root, "bucket")
    run_operation(OP, BucketOptions(boundaries=(20, 40), batch_size=(8,)), src, bucket, OutputOptions(format="arrow"),
                  QUIET, seed=1)
    return {"bucket": bucket, "segment": segment_output(root, "arrow")}


def child(*args: str) -> list[dict]:
    """Run tests/ipc_mutations.py capped; its JSON lines (it must end normally, under the cap)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + HERE}
    done = run_capped([sys.executable, os.path.join(HERE, "ipc_mutations.py"), *args], CAP, env=env, timeout=HANG_GUARD)
    assert not done.killed_for_memory, f"the child passed {CAP >> 20} MiB"
    assert done.returncode == 0, f"the child died (status {done.returncode}) after: {done.stdout[-300:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


def clean_digest(dst: str) -> str:
    """Of every batch read without checksums (verify=False)."""
    from ipc_mutations import digest

    return digest(batchtool.load(dst, shuffle=False, writable=False, verify=False))


@pytest.mark.parametrize("kind", ["bucket", "segment"])
@pytest.mark.parametrize("byte_class", ["footer", "metadata", "offsets", "validity", "values"])
def test_a_flipped_bit_anywhere_is_read_right_or_named(outputs, kind, byte_class):
    dst = outputs[kind]
    name = "part-00000.arrow"
    if byte_class == "validity" and kind == "segment":
        pytest.skip("segment output has no nulls, so no validity bitmap")
    results = child(dst, name, byte_class, "1", str(MUTATIONS))
    assert len(results) == MUTATIONS
    right = clean_digest(dst)
    for result in results:
        for mode in ("plain", "verified"):
            got = result[mode]
            if "error" in got:
                assert got["batchtool"] and name in got["error"], (result["at"], mode, got)
            elif mode == "verified":
                assert got["digest"] == right, (result["at"], got)  # plain reads cannot tell a changed value
    if byte_class == "values":  # only the checksum tells a changed value
        assert all("error" in r["verified"] for r in results)


def test_the_byte_classes_cover_the_file(outputs):
    from ipc_mutations import byte_classes

    path = os.path.join(outputs["bucket"], "part-00000.arrow")
    classes = byte_classes(path)
    assert all(classes[c] for c in classes)
    assert sum(len(v) for v in classes.values()) <= os.path.getsize(path)


# --- manifests -------------------------------------------------------------------------------------------------

def with_manifest(tmp_path, dst: str, change) -> str:
    copy = str(tmp_path / "copy")
    shutil.copytree(dst, copy)
    path = manifest_file(copy)
    manifest = json.load(open(path))
    change(manifest)
    json.dump(manifest, open(path, "w"))
    return copy


MANIFEST_CHANGES = {
    "huge batch count": (lambda m, other: m["output"]["files"][0].update(batches=10**12),
                         r"part-00000.arrow: .* lists 1,000,000,000,000 batches, more than its [0-9,]+ bytes can hold"),
    "a few batches more": (lambda m, other: m["output"]["files"][0].update(batches=m["output"]["files"][0]["batches"] + 4),
                           r"part-00000.arrow: \d+ record batches, but .* lists \d+"),
    "fewer rows": (lambda m, other: m["output"]["files"][0].update(rows=1),
                   r"part-00000.arrow, record batch \d+: \d+ rows, but .* lists 1 for the whole file"),
    "other size": (lambda m, other: m["output"]["files"][0].update(bytes=m["output"]["files"][0]["bytes"] + 1),
                   r"part-00000.arrow: [\d,]+ bytes, but .* says [\d,]+ \(truncated since it was written\)"),
    "path outside": (lambda m, other: m["output"]["files"][0].update(path="../../etc/passwd"),
                     r"output.files\[0\].path '../../etc/passwd' leaves the dataset directory"),
    "missing file": (lambda m, other: m["output"]["files"][0].update(path="part-09999.arrow"),
                     r"part-09999.arrow: listed in .* but missing"),
    "other schema": (lambda m, other: m.update(schema=batchtool.load(other).manifest["schema"]),
                     r"part-00000.arrow: schema differs from the output's"),
}


@pytest.mark.parametrize("change", sorted(MANIFEST_CHANGES))
def test_a_manifest_that_lies_is_an_error_naming_the_file(outputs, tmp_path, change):
    edit, message = MANIFEST_CHANGES[change]
    copy = with_manifest(tmp_path, outputs["bucket"], lambda m: edit(m, outputs["segment"]))
    code = ("import batchtool, sys\n"
            "try:\n"
            f"    loader = batchtool.load({copy!r}, shuffle=False)\n"
            "    print(len(loader)); [None for _ in loader]\n"
            "except batchtool.core.errors.BatchtoolError as exc:\n"
            "    print('error:', exc)\n")
    env = {**os.environ, "PYTHONPATH": REPO}
    done = run_capped([sys.executable, "-c", code], CAP, env=env, timeout=HANG_GUARD)
    assert done.returncode == 0 and not done.killed_for_memory, done.stderr[-500:]
    last = done.stdout.splitlines()[-1]  # len(loader) may come first: footers are checked as files are read
    assert last.startswith("error: ") and re.search(message, last), done.stdout


# --- a shard truncated while an epoch runs -----------------------------------------------------------------------

def test_a_shard_truncated_mid_epoch_is_an_error_not_sigbus(outputs, tmp_path):
    """The child reads half an epoch, truncates the file it is reading (as a copy over it or a full disk would),
    and reads on: an InputError naming the file, whatever arrays of the map it had read are copies."""
    copy = str(tmp_path / "copy")
    shutil.copytree(outputs["segment"], copy)
    path = os.path.join(copy, "part-00000.arrow")
    code = ("import os, batchtool\n"
            f"loader = batchtool.load({copy!r}, threads=1)\n"
            "it = iter(loader)\n"
            "for _ in range(len(loader) // 2): next(it)\n"
            f"os.truncate({path!r}, os.path.getsize({path!r}) // 3)\n"
            "try:\n"
            "    for _ in it: pass\n"
            "except batchtool.core.errors.InputError as exc:\n"
            "    print('error:', exc)\n")
    done = run_capped([sys.executable, "-c", code], CAP, env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.startswith(f"error: {path}: truncated to "), done.stdout


def test_a_shard_truncated_before_the_epoch_is_an_error(outputs, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(outputs["bucket"], copy)
    path = os.path.join(copy, "part-00000.arrow")
    os.truncate(path, os.path.getsize(path) - 100)
    with pytest.raises(InputError, match=r"part-00000.arrow: [\d,]+ bytes, but .* \(truncated since it was written\)"):
        batchtool.load(copy)


def test_the_cli_check_names_a_batch_whose_checksum_differs(outputs, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(outputs["bucket"], copy)
    from ipc_mutations import byte_classes

    path = os.path.join(copy, "part-00000.arrow")
    at = byte_classes(path)["values"][5]
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([old ^ 1]))
    crc = r"part-00000.arrow, record batch 0: corrupt \(CRC32C [0-9a-f]{8}, the writer recorded [0-9a-f]{8}"
    for verify in (None, True):  # checked by default
        with pytest.raises(InputError, match=crc):
            list(batchtool.load(copy, shuffle=False, verify=verify))
        with pytest.raises(InputError, match=crc):
            batchtool.source(copy, verify=verify)[0]
    assert clean_digest(copy) != clean_digest(outputs["bucket"])  # verify=False: the changed value, unnoticed
    done = subprocess.run([sys.executable, "-m", "batchtool", "check", copy], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)
    assert done.returncode == 1 and "record batch 0: corrupt (CRC32C" in done.stdout + done.stderr, done.stdout


def test_outputs_written_before_batch_checksums_still_load_and_say_why_they_cannot_verify(outputs, tmp_path):
    from ipc_mutations import digest

    def older(manifest: dict) -> None:
        for entry in manifest["output"]["files"]:
            del entry["batch_checksums"]

    copy = with_manifest(tmp_path, outputs["bucket"], older)
    assert clean_digest(copy) == clean_digest(outputs["bucket"])
    assert not batchtool.load(copy).verify and batchtool.load(outputs["bucket"]).verify  # the default: where it can
    assert digest(batchtool.load(copy, shuffle=False, writable=False)) == clean_digest(copy)
    assert len(list(batchtool.load(outputs["bucket"], verify=True))) == len(batchtool.load(copy))
    with pytest.raises(UsageError, match=r"verify=True: .* has no batch checksums to verify: .*part-00000.arrow: "
                                         r"written by a batchtool that recorded no batch checksums"):
        batchtool.load(copy, verify=True)


# --- compressed outputs ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> dict[str, str]:
    """The fuzz outputs with their buffers compressed: zstd bucket output, lz4 segment output."""
    root = str(tmp_path_factory.mktemp("compressed"))
    src = write_parquet_shards(os.path.join(root, "src"), make_table(120, seed=7))
    bucket = os.path.join(root, "bucket")
    run_operation(OP, BucketOptions(boundaries=(20, 40), batch_size=(8,)), src, bucket,
                  OutputOptions(format="arrow", compression="zstd"), QUIET, seed=1)
    return {"bucket": bucket, "segment": segment_output(root, "arrow", compression="lz4")}


@pytest.mark.parametrize("kind", ["bucket", "segment"])
@pytest.mark.parametrize("byte_class", ["metadata", "prefixes", "frames"])
def test_a_flipped_bit_in_a_compressed_output_is_read_or_named_with_its_batch(compressed, kind, byte_class):
    """A changed length prefix or frame byte is one BatchtoolError naming the file and the record batch (never an
    ArrowMemoryError or an allocation of what a prefix declares), or a read; checked without checksums (verify=False),
    which is what the size checks stand alone for."""
    dst, name = compressed[kind], "part-00000.arrow"
    results = child(dst, name, byte_class, "2", str(MUTATIONS))
    assert len(results) == MUTATIONS
    for result in results:
        got = result["plain"]
        if "error" in got:
            assert got["batchtool"] and name in got["error"], (result["at"], got)
            if byte_class != "metadata":
                assert re.search(r"record batch \d+", got["error"]), (result["at"], got)


def _load_in_child(dst: str) -> subprocess.CompletedProcess:
    """Every batch of DST read (verify=False) in a child capped at CAP."""
    script = ("import sys, batchtool\n"
              "try:\n"
              "    for _ in batchtool.load(sys.argv[1], shuffle=False, verify=False): pass\n"
              "except batchtool.core.errors.BatchtoolError as exc:\n"
              "    print(exc, file=sys.stderr)\n"
              "    sys.exit(2)\n")
    return run_capped([sys.executable, "-c", script, dst], CAP, env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)


def _as_output(bomb: str, like: str, tmp_path, recorded: bool) -> str:
    """DST `like` (an output of one int64 column x) with its file replaced by `bomb`, the manifest's sizes made the
    bomb's (as a manifest that lies would be), and its largest batch recorded or not (an older batchtool's)."""
    dst = str(tmp_path / f"dst-{recorded}")
    shutil.copytree(like, dst)
    shutil.copy(bomb, os.path.join(dst, "part-00000.arrow"))
    path = manifest_file(dst)
    manifest = json.load(open(path))
    entry = manifest["output"]["files"][0]
    entry.update(bytes=os.path.getsize(bomb), rows=2**28, batches=1)
    if not recorded:
        del entry["largest_batch_bytes"]
    json.dump(manifest, open(path, "w"))
    return dst


@pytest.mark.parametrize("recorded", [True, False])
def test_a_compressed_batch_that_inflates_past_the_limit_is_refused_before_it_is_decompressed(tmp_path, recorded):
    """65 KB of zstd that really inflates to 2 GiB, and a genuine batch whose length prefix declares 2^50 bytes: each
    is one error naming the file and the batch, in a child capped at 600 MB."""
    like = str(tmp_path / "like")
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"x": pa.array(range(64))}), shards=1)
    run_operation(SHUFFLE, ShuffleOptions(), src, like, OutputOptions(format="arrow", compression="zstd"), QUIET,
                  seed=1)
    bomb = write_bomb(tmp_path / "bomb.arrow", 2 << 30)
    dst = _as_output(str(bomb), like, tmp_path, recorded)
    run = _load_in_child(dst)
    assert run.returncode == 2 and not run.killed_for_memory, run.stderr
    limit = "656 of the largest batch" if recorded else "134,217,728 allowed a batch of a file whose largest batch"
    assert run.stderr.startswith(f"{dst}/part-00000.arrow, record batch 0: corrupt (its compressed buffers declare "
                                 f"2,147,483,648 bytes decompressed, more than the {limit}"), run.stderr
    declared = str(tmp_path / f"declared-{recorded}")
    shutil.copytree(like, declared)
    path = os.path.join(declared, "part-00000.arrow")
    data = bytearray(open(path, "rb").read())
    message = ipc_meta.file_layout(lambda at, n: bytes(data[at:at + n]), len(data)).batches[0]
    offset = message.start + int(message.buffers[message.buffers[:, 1] > 0][-1, 0])
    data[offset:offset + 8] = (1 << 50).to_bytes(8, "little")
    open(path, "wb").write(bytes(data))
    if not recorded:
        _as_output(path, declared, tmp_path / "unrecorded", recorded)  # (the same file, no largest batch recorded)
    run = _load_in_child(declared if recorded else str(tmp_path / "unrecorded" / f"dst-{recorded}"))
    assert run.returncode == 2 and "record batch 0: corrupt (its compressed buffers declare 1,125,899,906,842," in \
        run.stderr, run.stderr
