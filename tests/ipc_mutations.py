"""Single-byte mutations of an Arrow IPC shard by what the byte is (footer, metadata, offsets, validity, values; in
a compressed batch's body, its buffers' length prefixes and compressed frames), each read back through batchtool.load; run as a script, it is the child process the fuzz tests cap and watch.

    python tests/ipc_mutations.py DST FILE CLASS SEED COUNT

mutates COUNT bytes of class CLASS of DST/FILE, one at a time (a fresh copy each), and prints one JSON line
per mutation: {"at", "plain", "verified"}, each either {"digest"} (every batch read and converted) or {"error",
"type"} (the exception batchtool.load raised). A crash ends the child: the test sees the signal.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import pyarrow as pa

CLASSES = ("footer", "metadata", "offsets", "validity", "values")
COMPRESSED = ("prefixes", "frames")
"""The byte classes of a compressed batch's body: each buffer's 8-byte uncompressed length, and its lz4/zstd frame."""


def byte_classes(path: str) -> dict[str, list[int]]:
    """Every byte position of an Arrow IPC file, by class: the file's footer and magic, each message's
    metadata, and in each record batch's body its offsets, validity bitmaps and values, or where the body is
    compressed, its buffers' length prefixes and frames (COMPRESSED: classes only compressed files have)."""
    from batchtool.io.formats import ipc_meta

    data = open(path, "rb").read()
    out: dict[str, list[int]] = {c: [] for c in CLASSES}
    layout = ipc_meta.file_layout(lambda at, n: data[at:at + n], len(data))
    compressed = {m.start: m for m in layout.batches if m.compressed}
    stream = pa.BufferReader(pa.py_buffer(data))
    stream.seek(8)  # ARROW1 and padding
    schema = None
    while True:
        start = stream.tell()
        try:
            message = pa.ipc.read_message(stream)
        except (EOFError, pa.ArrowInvalid):
            break
        body = message.body
        body_start = stream.tell() - (body.size if body is not None else 0)
        out["metadata"] += range(start, body_start)
        if message.type == "schema":
            schema = pa.ipc.read_schema(message)
            continue
        if body_start in compressed:
            batch_message = compressed[body_start]
            for offset, length in batch_message.buffers[batch_message.buffers[:, 1] > 0].tolist():
                out.setdefault("prefixes", []).extend(range(body_start + offset, body_start + offset + 8))
                out.setdefault("frames", []).extend(range(body_start + offset + 8, body_start + offset + length))
            continue
        batch = pa.ipc.read_record_batch(message, schema)
        for column in batch.columns:
            _classify(column, body.address - body_start, out)
    out["footer"] += range(stream.tell(), len(data))
    return out


def _classify(arr: pa.Array, base: int, out: dict[str, list[int]]) -> None:
    """The body bytes of one array (its children included) by what they hold."""
    buffers = arr.buffers()
    kind = arr.type
    own = 3 if (pa.types.is_string(kind) or pa.types.is_binary(kind)) else \
        1 if pa.types.is_fixed_size_list(kind) else 2
    roles = ["validity", "offsets" if own == 3 or pa.types.is_list(kind) else "values", "values"][:own]
    for role, buffer in zip(roles, buffers[:own]):
        if buffer is not None and buffer.size:
            out[role] += range(buffer.address - base, buffer.address - base + buffer.size)
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
        _classify(arr.values, base, out)


def digest(batches) -> str:
    """One hash of every array of every batch, in order."""
    h = hashlib.sha256()
    for batch in batches:
        for name, array in batch.items():
            h.update(name.encode())
            if array.dtype == object:
                h.update(repr(array.tolist()).encode())
            else:
                h.update(str(array.shape).encode() + np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def read_all(dst: str, verify: bool) -> dict:
    import batchtool

    try:
        return {"digest": digest(batchtool.load(dst, shuffle=False, verify=verify, writable=False, threads=1))}
    except Exception as exc:  # the test asserts it is a BatchtoolError naming the file
        return {"error": str(exc), "type": type(exc).__name__,
                "batchtool": isinstance(exc, __import__("batchtool").BatchtoolError)}


def main(dst: str, name: str, kind: str, seed: int, count: int) -> None:
    positions = byte_classes(os.path.join(dst, name))[kind]
    picks = random.Random(seed).sample(positions, min(count, len(positions)))
    with tempfile.TemporaryDirectory() as tmp:
        for at in picks:
            copy = os.path.join(tmp, "dst")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(dst, copy)
            target = os.path.join(copy, name)
            with open(target, "r+b") as f:
                f.seek(at)
                old = f.read(1)[0]
                f.seek(at)
                f.write(bytes([old ^ (1 << random.Random(seed + at).randrange(8))]))
            print(json.dumps({"at": at, "plain": read_all(copy, False), "verified": read_all(copy, True)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
