"""What the input's metadata says of its columns (Hugging Face `datasets` features, pandas' column entries, any field's
own metadata) is in every output where the column is written as it was read: under its new name, in the output's
column order, and not for a column whose type an operation changed. Read back by the real clients."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.io.formats import column_meta
from conftest import invoke_cli, read_dir

ROWS = 24
NAMES = ["cat", "dog", "bird"]


@pytest.fixture(scope="module")
def features(datasets):
    return datasets.Features({"key": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES),
                              "tokens": datasets.Sequence(datasets.Value("int32")),
                              "weight": datasets.Value("float32"), "keep": datasets.Value("bool")})


@pytest.fixture(scope="module")
def sources(datasets, features, tmp_path_factory) -> dict[str, str]:
    """The same rows as a save_to_disk split ("hf") and as Parquet ("pq") that also carries a key of its own in the
    schema's metadata and a field's metadata on `tokens` (datasets' features included in both); a copy of each, for
    mix."""
    root = tmp_path_factory.mktemp("meta")
    dataset = datasets.Dataset.from_dict(
        {"key": [f"k{i:02d}" for i in range(ROWS)], "label": [i % 3 for i in range(ROWS)],
         "tokens": [list(range(1 + i % 5)) for i in range(ROWS)], "weight": [0.5 + i % 4 for i in range(ROWS)],
         "keep": [i % 3 != 2 for i in range(ROWS)]}, features=features)
    dataset.save_to_disk(str(root / "hf"), num_shards=2)
    table = dataset.data.table
    tokens = table.schema.field("tokens").with_metadata({"unit": "steps"})
    table = table.cast(table.schema.set(table.schema.get_field_index("tokens"), tokens))
    os.makedirs(root / "pq")
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"origin": b"lab-7"}),
                   str(root / "pq" / "data.parquet"))
    shutil.copytree(root / "hf", root / "hf-copy")
    shutil.copytree(root / "pq", root / "pq-copy")
    return {name: str(root / name) for name in ("hf", "pq", "hf-copy", "pq-copy")}


def run(*args: object) -> None:
    result = invoke_cli(*args, "-q")
    assert result.exit_code == 0, result.stderr


def pipeline(src: str, dst: str) -> str:
    """Three columns of SRC, then filter -> rename -> select, as a pipeline file beside DST."""
    path = f"{dst}.toml"
    with open(path, "w") as f:
        f.write(f'[input]\npath = "{src}"\ncolumns = ["keep", "label", "tokens"]\n\n'
                '[[stage]]\nop = "filter"\ncolumn = "keep"\n\n'
                '[[stage]]\nop = "rename"\ncolumns = { label = "target" }\n\n'
                '[[stage]]\nop = "select"\ncolumns = ["tokens", "target"]\n\n'
                f'[output]\npath = "{dst}"\n')
    return path


SRC, OTHER, DST, BATCHES = "SRC", "OTHER", "DST", ("--to", "parquet")
ALL = {c: c for c in ("key", "label", "tokens", "weight", "keep")}
COMMANDS = {
    # a run: (its command line, {output column: the input column whose feature it keeps}); OTHER: a copy of SRC
    "convert": (["convert", SRC, DST], ALL),
    "convert-columns": (["convert", SRC, DST, "--columns", "tokens,label"], {"tokens": "tokens", "label": "label"}),
    "filter": (["filter", SRC, DST, "--column", "keep"], ALL),
    "select": (["select", SRC, DST, "--columns", "tokens,label"], {"tokens": "tokens", "label": "label"}),
    "rename": (["rename", SRC, DST, "--columns", "label=target,key=label"],
               {"label": "key", "target": "label", "tokens": "tokens", "weight": "weight", "keep": "keep"}),
    "stratify": (["stratify", SRC, DST, "--label", "label", "--target", "uniform"], ALL),
    "resample": (["resample", SRC, DST, "--weight", "weight", "--overall-rate", "1.0"], ALL),
    "shuffle": (["shuffle", SRC, DST, "--seed", "1"], ALL),
    "bucket": (["bucket", SRC, DST, "--length", "tokens", "--sequence", "tokens", "--boundaries", "3",
                "--batch-size", "4", *BATCHES], ALL),
    "pack": (["pack", SRC, DST, "--max-length", "8", "--sequence", "tokens", "--batch-size", "2", *BATCHES],
             {"tokens": "tokens"}),
    "segment": (["segment", SRC, DST, "--key", "key", "--sequence", "tokens", "--num-unroll", "2", "--batch-size", "4",
                 *BATCHES], {"label": "label", "tokens": "tokens", "weight": "weight", "keep": "keep"}),
    "mix": (["mix", SRC, OTHER, DST, "--weights", "1,1"], ALL),
    "mix-columns": (["mix", SRC, OTHER, DST, "--weights", "1,1", "--columns", "label,tokens"],
                    {"label": "label", "tokens": "tokens"}),
    "run": (["run", "PIPELINE"], {"tokens": "tokens", "target": "label"}),
}


@pytest.fixture(scope="module")
def outputs(sources, tmp_path_factory) -> dict[tuple[str, str], str]:
    """Every run's output of each source, made once."""
    root = tmp_path_factory.mktemp("out")
    made = {}
    for source in ("hf", "pq"):
        for name, (line, _) in COMMANDS.items():
            dst = made[source, name] = str(root / f"{source}-{name}")
            given = {SRC: sources[source], OTHER: sources[f"{source}-copy"], DST: dst}
            if line[0] == "run":
                given["PIPELINE"] = pipeline(sources[source], dst)
            run(*(given.get(arg, arg) for arg in line))
    return made


def hf_features(path: str) -> list[str] | None:
    """The columns the `huggingface` metadata of a Parquet output describes, in its order."""
    metadata = pq.read_schema(sorted(glob.glob(os.path.join(path, "*.parquet")))[0]).metadata or {}
    return list(json.loads(metadata[b"huggingface"])["info"]["features"]) if b"huggingface" in metadata else None


@pytest.mark.parametrize("source", ["hf", "pq"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_datasets_reads_every_output_with_the_features_of_its_unchanged_columns(datasets, features, outputs, source,
                                                                                command, tmp_path):
    path = outputs[source, command]
    kept = COMMANDS[command][1]
    schema = pq.read_schema(sorted(glob.glob(os.path.join(path, "*.parquet")))[0])
    assert hf_features(path) == [c for c in schema.names if c in kept]
    read = datasets.Dataset.from_parquet(sorted(glob.glob(os.path.join(path, "*.parquet"))),
                                         cache_dir=str(tmp_path / "hf"), keep_in_memory=True)
    inferred = datasets.Features.from_arrow_schema(schema.remove_metadata())
    assert read.features == datasets.Features({c: features[kept[c]] if c in kept else inferred[c]
                                               for c in schema.names})
    assert read.num_rows == read_dir(path).num_rows
    if "label" in kept.values():
        column = next(c for c, was in kept.items() if was == "label")
        assert read.features[column].names == NAMES


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_fields_own_metadata_and_the_schemas_other_keys_are_kept(outputs, command):
    schema = pq.read_schema(sorted(glob.glob(os.path.join(outputs["pq", command], "*.parquet")))[0])
    assert schema.metadata[b"origin"] == b"lab-7"
    assert schema.field("tokens").metadata == {b"unit": b"steps"}
    assert not any(f.metadata and column_meta.MARK in f.metadata for f in schema)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_pandas_and_polars_read_every_output(outputs, command):
    pandas = pytest.importorskip("pandas")
    polars = pytest.importorskip("polars")
    path = outputs["hf", command]
    expected = read_dir(path)
    for read in (pandas.read_parquet(path), polars.read_parquet(os.path.join(path, "*.parquet"))):
        assert list(read.columns) == expected.column_names and len(read) == expected.num_rows


def test_load_dataset_and_arrow_outputs_read_the_features(datasets, features, sources, tmp_path):
    run("select", sources["hf"], tmp_path / "arrow", "--columns", "label,tokens", "--to", "arrow")
    run("select", sources["hf"], tmp_path / "parquet", "--columns", "label,tokens")
    expected = datasets.Features({"label": features["label"], "tokens": features["tokens"]})
    arrow = datasets.load_dataset("arrow", data_files=str(tmp_path / "arrow" / "*.arrow"), split="train",
                                  cache_dir=str(tmp_path / "hf"))
    parquet = datasets.load_dataset("parquet", data_dir=str(tmp_path / "parquet"), split="train",
                                    cache_dir=str(tmp_path / "hf"))
    assert arrow.features == parquet.features == expected
    assert parquet["label"] == [i % 3 for i in range(ROWS)]


def test_mix_keeps_a_feature_only_where_every_source_has_it(datasets, features, sources, tmp_path):
    other = datasets.Dataset.from_parquet(os.path.join(sources["pq"], "data.parquet"), cache_dir=str(tmp_path / "c"))
    other = other.cast_column("label", datasets.ClassLabel(names=["x", "y", "z"]))
    other.to_parquet(str(tmp_path / "other.parquet"))
    run("mix", sources["hf"], tmp_path / "other.parquet", tmp_path / "dst", "--weights", "1,1")
    read = datasets.Dataset.from_parquet(glob.glob(str(tmp_path / "dst" / "*.parquet")), cache_dir=str(tmp_path / "c"))
    assert read.features["label"] == datasets.Value("int64")
    assert [read.features[c] for c in ("key", "tokens")] == [features["key"], features["tokens"]]


@pytest.fixture(scope="module")
def frame_src(tmp_path_factory) -> str:
    """A Parquet file written from pandas: an index of strings (a column `id`), a nullable Int64 column, lists."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"count": pandas.array([i if i % 4 else None for i in range(12)], dtype="Int64"),
                              "tokens": [list(range(1 + i % 3)) for i in range(12)], "n": list(range(12))},
                             index=pandas.Index([f"r{i}" for i in range(12)], name="id"))
    path = tmp_path_factory.mktemp("frame") / "frame.parquet"
    frame.to_parquet(path)
    return str(path)


@pytest.mark.parametrize("args, index, dtypes", [
    (["convert"], "id", {"count": "Int64", "tokens": "object", "n": "int64"}),
    (["shuffle", "--seed", "3"], "id", {"count": "Int64", "tokens": "object", "n": "int64"}),
    (["select", "--columns", "n,count"], None, {"n": "int64", "count": "Int64"}),
    (["rename", "--columns", "count=n,n=count,id=name"], None,
     {"n": "Int64", "tokens": "object", "count": "int64", "name": "string"}),
    (["pack", "--max-length", "6", "--sequence", "tokens", "--batch-size", "2", "--to", "parquet"], None,
     {"count": "object", "tokens": "object", "n": "object", "id": "object", "segment_ids": "object",
      "positions": "object", "cu_seqlens": "object", "num_examples": "int32", "length": "int32", "batch": "int64"}),
])
def test_pandas_reads_its_index_and_dtypes_where_the_columns_are_unchanged(frame_src, tmp_path, args, index, dtypes):
    pandas = pytest.importorskip("pandas")
    run(args[0], frame_src, tmp_path / "dst", *args[1:])
    read = pandas.read_parquet(tmp_path / "dst")
    strings = str(pandas.Series(["a"]).dtype)  # pandas' own string dtype: "str" from pandas 3, "object" before
    assert read.index.name == index
    assert {c: str(t) for c, t in read.dtypes.items()} == {c: strings if t == "string" else t for c, t in dtypes.items()}
    rows = read_dir(str(tmp_path / "dst"))
    assert len(read) == rows.num_rows
    if index is not None:
        assert list(read.index) == rows["id"].to_pylist()
    if "count" in rows.column_names and args[0] != "pack":
        assert [None if pandas.isna(v) else int(v) for v in read["count"]] == rows["count"].to_pylist()


def test_a_range_index_is_not_written(tmp_path):
    """A range index numbers the rows of the file pandas wrote: batchtool's shards have other rows."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"x": list(range(10))}, index=pandas.RangeIndex(100, 110, name="n"))
    frame.to_parquet(tmp_path / "in.parquet")
    run("shuffle", tmp_path / "in.parquet", tmp_path / "dst", "--seed", "1")
    read = pandas.read_parquet(tmp_path / "dst")
    assert read.index.equals(pandas.RangeIndex(10)) and sorted(read["x"]) == list(range(10))


def test_metadata_that_is_not_the_expected_json_is_kept_as_it_is(tmp_path):
    table = pa.table({"a": [1, 2], "b": [3, 4]}).replace_schema_metadata(
        {"huggingface": b"[" * 100_000, "pandas": b"{\"columns\": 3}"})
    pq.write_table(table, tmp_path / "in.parquet")
    run("select", tmp_path / "in.parquet", tmp_path / "dst", "--columns", "b")
    metadata = pq.read_schema(glob.glob(str(tmp_path / "dst" / "*.parquet"))[0]).metadata
    assert metadata == {b"huggingface": b"[" * 100_000, b"pandas": b"{\"columns\": 3}"}


def test_a_mark_in_the_input_is_not_taken_for_one_batchtool_made(tmp_path):
    field = pa.field("a", pa.int64(), metadata={column_meta.MARK: b'{"type": "x", "huggingface": {"_type": "Bad"}}'})
    pq.write_table(pa.table({"a": [1, 2]}, schema=pa.schema([field])), tmp_path / "in.parquet")
    run("convert", tmp_path / "in.parquet", tmp_path / "dst")
    schema = pq.read_schema(glob.glob(str(tmp_path / "dst" / "*.parquet"))[0])
    assert schema.metadata is None and schema.field("a").metadata is None


def test_a_pipeline_writes_the_metadata_its_commands_one_by_one_write(outputs, sources, tmp_path):
    """The pipeline's [input] columns, filter, rename and select, against those commands on each other's output (not
    byte for byte here: Parquet reads a list's child field back as `element`, while the pipeline keeps `datasets`'
    `item`)."""
    steps = [["convert", "--columns", "keep,label,tokens"], ["filter", "--column", "keep"],
             ["rename", "--columns", "label=target"], ["select", "--columns", "tokens,target"]]
    src = sources["hf"]
    for i, (command, *args) in enumerate(steps):
        run(command, src, tmp_path / str(i), *args)
        src = tmp_path / str(i)
    chained, piped = (pq.read_schema(glob.glob(os.path.join(d, "*.parquet"))[0]) for d in (src, outputs["hf", "run"]))
    assert chained.metadata == piped.metadata and read_dir(str(src)).equals(read_dir(outputs["hf", "run"]))


@settings(max_examples=40)
@given(order=st.permutations(range(5)), kept=st.integers(0, 5), renamed=st.lists(st.booleans(), min_size=5, max_size=5),
       changed=st.lists(st.booleans(), min_size=5, max_size=5))
def test_the_features_written_follow_the_columns_whatever_an_operation_does_with_them(order, kept, renamed, changed):
    """Any projection, order, renaming and change of type of the columns between reading and writing: the features
    written are those of the columns written that keep their type, under their names, in their order."""
    feature = {f"c{i}": {"dtype": "int64", "_type": "Value", "i": i} for i in range(5)}
    read = column_meta.carried(pa.schema([pa.field(f"c{i}", pa.int64()) for i in range(5)], metadata={
        "huggingface": json.dumps({"info": {"features": feature}, "fingerprint": "f"})}))
    columns = order[:kept]
    written = column_meta.described(pa.schema(
        [read.field(f"c{i}").with_name(f"r{i}" if renamed[i] else f"c{i}")
         .with_type(pa.list_(pa.int64()) if changed[i] else pa.int64()) for i in columns], metadata=read.metadata))
    expected = {f"r{i}" if renamed[i] else f"c{i}": feature[f"c{i}"] for i in columns if not changed[i]}
    assert (json.loads(written.metadata[b"huggingface"]) if written.metadata else None) == \
        ({"info": {"features": expected}} if expected else None)
    assert all(f.metadata is None for f in written)
