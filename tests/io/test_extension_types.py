"""Arrow extension types through every command and output format: operations see the storage, the output keeps the
extension type (pack's per-example lists: lists of it), values as a run on the storage alone gives them."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchtool
from batchtool.io.inputs import open_dataset
from batchtool.exec.inspection import inspect
from batchtool.core.synthetic import make_table
from conftest import read_dir


class Rating(pa.ExtensionType):
    """A user's own extension type, registered in this process."""

    def __init__(self) -> None:
        super().__init__(pa.int16(), "test.rating")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Rating:
        return cls()


class Elsewhere(pa.ExtensionType):
    """A type registered only by whoever wrote the file: this process reads its storage and Arrow's metadata."""

    def __init__(self) -> None:
        super().__init__(pa.int32(), "test.elsewhere")

    def __arrow_ext_serialize__(self) -> bytes:
        return b"v1"

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Elsewhere:
        return cls()


def _canonical(factory: str, make, storage: pa.DataType, values) -> tuple:
    available = hasattr(pa, factory)
    return (make() if available else None), storage, values, pytest.mark.skipif(
        not available, reason=f"pyarrow {pa.__version__} has no pa.{factory}")


N = 300
TYPES = {  # name: (extension type or None, storage, storage values of N rows, skip mark)
    "uuid": _canonical("uuid", lambda: pa.uuid(), pa.binary(16), [uuid.UUID(int=i).bytes for i in range(N)]),
    "fixed_shape_tensor": _canonical("fixed_shape_tensor", lambda: pa.fixed_shape_tensor(pa.float32(), [2, 2]),
                                     pa.list_(pa.float32(), 4), [[i, -i, 0.5, 1.0] for i in range(N)]),
    "bool8": _canonical("bool8", lambda: pa.bool8(), pa.int8(), [i % 2 for i in range(N)]),
    "json": _canonical("json_", lambda: pa.json_(), pa.string(), [f'{{"i": {i}}}' for i in range(N)]),
    "opaque": _canonical("opaque", lambda: pa.opaque(pa.binary(), "geometry", "test"), pa.binary(),
                         [b"g%d" % i for i in range(N)]),
    "registered": (Rating(), pa.int16(), [i % 5 for i in range(N)], pytest.mark.skipif(False, reason="")),
}
SEQUENCE = "ids"
"""A sequence column of uuids: one per step of `tokens`."""


@pytest.fixture(scope="module", autouse=True)
def registered():
    pa.register_extension_type(Rating())
    yield
    pa.unregister_extension_type("test.rating")


def _columns(extended: bool) -> dict[str, pa.Array]:
    """Every available extension column, or the same values as their storage."""
    out = {}
    for name, (ext, storage, values, _) in TYPES.items():
        if ext is not None:
            array = pa.array(values, storage)
            out[name] = pa.ExtensionArray.from_storage(ext, array) if extended else array
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """The corpus with the extension columns (and a type registered only while it was written, and a sequence of
    uuids), and the same data as plain storage columns."""
    corpus = make_table(N, seed=7)
    steps = [len(t) for t in corpus["tokens"].to_pylist()]
    uuids = pa.array([[uuid.UUID(int=i * 1000 + j).bytes for j in range(n)] for i, n in enumerate(steps)],
                     pa.list_(pa.binary(16)))
    elsewhere = pa.array([i % 7 for i in range(N)], pa.int32())
    made = {}
    for kind, extended in (("ext", True), ("plain", False)):
        table = corpus
        for name, array in _columns(extended).items():
            table = table.append_column(name, array)
        sequence = uuids.cast(pa.list_(pa.uuid())) if extended and hasattr(pa, "uuid") else uuids
        table = table.append_column(SEQUENCE, sequence)
        directory = tmp_path_factory.mktemp(kind)
        if extended:
            pa.register_extension_type(Elsewhere())
            table = table.append_column("elsewhere", pa.ExtensionArray.from_storage(Elsewhere(), elsewhere))
        else:
            table = table.append_column("elsewhere", elsewhere)
        try:
            pq.write_table(table, directory / "part-0.parquet", row_group_size=100)
        finally:
            if extended:
                pa.unregister_extension_type("test.elsewhere")
        made[kind] = str(directory)
    return made


def _stored(table: pa.Table) -> pa.Table:
    """The table with every extension column as its storage, and no field metadata: what the plain run writes."""
    def storage(t: pa.DataType) -> pa.DataType:
        if isinstance(t, pa.BaseExtensionType):
            return t.storage_type
        return pa.list_(storage(t.value_type)) if pa.types.is_list(t) else t
    return table.cast(pa.schema([pa.field(f.name, storage(f.type)) for f in table.schema]))


COMMANDS = {
    "convert": ["convert"],
    "shuffle": ["shuffle", "--memory", "64KB"],
    "resample": ["resample", "--rate", "1.5"],
    "stratify": ["stratify", "--label", "label", "--target", "uniform"],
    "balanced stratify": ["stratify", "--label", "label", "--target", "uniform", "--balanced-batches",
                          "--batch-size", "8"],
    "bucket": ["bucket", "--length", "tokens", "--sequence", f"tokens,frames,{SEQUENCE}", "--boundaries", "20",
               "--batch-size", "8"],
    "segment": ["segment", "--key", "key", "--sequence", f"tokens,frames,{SEQUENCE}", "--num-unroll", "10",
                "--batch-size", "4"],
    "pack": ["pack", "--max-length", "256", "--sequence", f"tokens,frames,{SEQUENCE}", "--batch-size", "4",
             "--split-long"],
    "select": ["select", "--columns", f"{SEQUENCE},uuid,label"],
}


def _run(run_cli, src: str, dst, command: list[str], to: str) -> None:
    result = run_cli(command[0], src, dst, *command[1:], "--to", to, "-q")
    assert result.exit_code == 0, result.stderr


RUNS = [(command, "parquet") for command in COMMANDS] + [
    (command, to) for command in ("convert", "bucket", "pack") for to in ("arrow", "tfrecord")]
"""Every command to Parquet; every other output format from a command of each kind (rows, padded, packed)."""


@pytest.mark.parametrize("command, to", RUNS)
def test_every_command_keeps_the_extension_types_and_the_values(run_cli, sources, tmp_path, command, to):
    for kind in ("ext", "plain"):
        _run(run_cli, sources[kind], tmp_path / kind, COMMANDS[command], to)
        if to == "tfrecord":  # read back through batchtool, which restores the types from the manifest
            assert run_cli("convert", tmp_path / kind, tmp_path / f"{kind}_back", "-q").exit_code == 0
    suffix = "_back" if to == "tfrecord" else ""
    got, plain = read_dir(str(tmp_path / f"ext{suffix}")), read_dir(str(tmp_path / f"plain{suffix}"))
    assert _stored(got).equals(_stored(plain))
    packed = command == "pack"
    for name, (ext, *_rest) in TYPES.items():
        if ext is not None and name in got.schema.names:
            assert got.schema.field(name).type == (pa.list_(ext) if packed else ext), name
    if SEQUENCE in got.schema.names and hasattr(pa, "uuid"):
        assert got.schema.field(SEQUENCE).type.value_type == pa.uuid()
    elsewhere = got.schema.field("elsewhere") if "elsewhere" in got.schema.names else None
    if elsewhere is not None:  # an unknown type keeps Arrow's marks, on the values of pack's lists
        marked = elsewhere.type.value_field if packed else elsewhere
        assert marked.metadata[b"ARROW:extension:name"] == b"test.elsewhere"


@pytest.mark.parametrize("name", [pytest.param(n, marks=t[3]) for n, t in TYPES.items()])
def test_inspect_shows_the_extension_type_and_load_reads_it(run_cli, sources, tmp_path, name):
    shown = {c["name"]: c["type"] for c in inspect(sources["ext"])["schema"]}
    assert shown[name] == str(TYPES[name][0])
    assert shown["elsewhere"] == "int32 (extension test.elsewhere)"
    _run(run_cli, sources["ext"], tmp_path / "b", COMMANDS["bucket"], "arrow")
    batches = list(batchtool.load(str(tmp_path / "b"), columns=[name, "label"]))
    assert sum(len(b["label"]) for b in batches) == N and all(len(b[name]) == len(b["label"]) for b in batches)


def test_operations_see_the_storage(sources):
    dataset = open_dataset(sources["ext"])
    assert not any(isinstance(f.type, pa.BaseExtensionType) for f in dataset.schema)
    chunk = next(dataset.chunks())
    assert not any(isinstance(c.type, pa.BaseExtensionType) for c in chunk.data.columns)


def one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_union_column_is_refused_naming_it_and_views_and_run_ends_are_read_as_plain(run_cli, tmp_path):
    n = 6
    table = pa.table({"key": [str(i) for i in range(n)], "tokens": [[i] * (i + 1) for i in range(n)],
                      "view": pa.array([f"s{i}" * 9 for i in range(n)], pa.string_view()),
                      "runs": pa.RunEndEncodedArray.from_arrays(pa.array([3, 6], pa.int32()), pa.array([7, 8]))})
    os.makedirs(tmp_path / "src")
    with pa.ipc.new_file(str(tmp_path / "src" / "p.arrow"), table.schema) as writer:
        writer.write_table(table)
    _run(run_cli, str(tmp_path / "src"), tmp_path / "out", ["shuffle"], "parquet")
    got = read_dir(str(tmp_path / "out"))
    assert got.schema.field("view").type == pa.string() and got.schema.field("runs").type == pa.int64()
    assert sorted(got["runs"].to_pylist()) == [7, 7, 7, 8, 8, 8]
    union = pa.UnionArray.from_sparse(pa.array([0, 1] * 3, pa.int8()), [pa.array(range(n)), pa.array(list("abcdef"))])
    with pa.ipc.new_file(str(tmp_path / "src" / "p.arrow"), table.append_column("u", union).schema) as writer:
        writer.write_table(table.append_column("u", union))
    assert one_error(run_cli("shuffle", tmp_path / "src", tmp_path / "bad")) == (
        f"error: {tmp_path / 'src'}: column 'u' is sparse_union<0: int64=0, 1: string=1>: a union, which no "
        "operation takes; leave it out (convert --columns, select --columns)")
    assert not (tmp_path / "bad").exists()
    _run(run_cli, str(tmp_path / "src"), tmp_path / "kept", ["select", "--columns", "key,runs"], "parquet")
