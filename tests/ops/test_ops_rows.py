"""filter, select and rename: commands generated from their operation definitions (ops/base.py), the same
kernels as their pipeline stages, and option errors named in each front end's words."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from conftest import data_bytes, read_dir, write_parquet_shards
from dirstate import snapshot
from hypothesis import given, settings
from strategies import record_batches

from batchtool.core import rng
from batchtool.io.dataset import Chunk
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.ops import OPERATIONS
from batchtool.ops.base import OptionError
from batchtool.core.options import Column, ColumnList, Flag, Integer, Number, NumberOrColumn, Pairs, build_options
from batchtool.ops.rename import RenameOptions
from batchtool.ops.select import SelectOptions


@pytest.fixture
def flagged(tmp_path) -> str:
    """Two shards of 3 rows; `keep` true, false and null."""
    table = pa.table({"key": ["a", "b", "c", "d", "e", "f"], "label": [0, 1, 2, 3, 0, 1],
                      "keep": pa.array([True, False, None, True, True, False]),
                      "tokens": [[1], [2, 2], [], [4], [5, 5], [6]]})
    return write_parquet_shards(str(tmp_path / "src"), table, shards=2, row_group_size=2)


def test_filter_keeps_true_rows_and_counts_them(tmp_path, run_cli, flagged):
    result = run_cli("filter", flagged, tmp_path / "out", "--column", "keep", "--threads", "2")
    assert result.exit_code == 0, result.stderr
    assert read_dir(str(tmp_path / "out")).column("key").to_pylist() == ["a", "d", "e"]
    assert result.stderr.splitlines()[0] == "filter: 6 rows in, 3 out"
    manifest = json.load(open(tmp_path / "out" / MANIFEST_NAME))
    assert manifest["command"] == "filter" and manifest["options"]["column"] == "keep"
    assert (manifest["stats"]["rows_in"], manifest["stats"]["rows_out"]) == (6, 3)


def test_select_and_rename_commands(tmp_path, run_cli, flagged):
    assert run_cli("select", flagged, tmp_path / "sel", "--columns", "tokens", "--columns", "key", "-q").exit_code == 0
    selected = read_dir(str(tmp_path / "sel"))
    assert selected.schema.names == ["tokens", "key"] and selected.column("key").to_pylist() == list("abcdef")
    assert run_cli("rename", flagged, tmp_path / "ren", "--columns", "label=class,keep=flag", "-q").exit_code == 0
    renamed = read_dir(str(tmp_path / "ren"))
    assert renamed.schema.names == ["key", "class", "flag", "tokens"]
    assert renamed.column("class").to_pylist() == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("args, message", [
    (["filter", "--column", "label"], "--column: column 'label' is int64, expected bool"),
    (["filter", "--column", "nope"], "--column: no column 'nope' in the input (columns: key, label, keep, tokens)"),
    (["select", "--columns", "key,nope"], "--columns: no column 'nope' in the input"),
    (["select", "--columns", "key,key"], "--columns: a column is named twice (key, key)"),
    (["rename", "--columns", "label=key"], "--columns: renaming gives two columns named 'key'"),
    (["rename", "--columns", "label=a,keep=a"], "--columns: two columns are renamed to the same name (a, a)"),
    (["rename", "--columns", "label"], "--columns 'label': expected OLD=NEW, e.g. label=class"),
])
def test_errors_are_one_line_naming_the_option_and_leave_nothing(tmp_path, run_cli, flagged, args, message):
    before = snapshot(tmp_path)
    result = run_cli(args[0], flagged, tmp_path / "out", *args[1:])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert snapshot(tmp_path) == before  # no DST, no temporary directory, SRC untouched


def test_dst_safety_is_every_writing_commands(tmp_path, run_cli, flagged):
    assert run_cli("select", flagged, tmp_path / "out", "--columns", "key", "-q").exit_code == 0
    again = run_cli("select", flagged, tmp_path / "out", "--columns", "label", "-q")
    assert again.exit_code == 2 and "exists" in again.stderr
    assert run_cli("select", flagged, tmp_path / "out", "--columns", "label", "--overwrite", "-q").exit_code == 0
    assert read_dir(str(tmp_path / "out")).schema.names == ["label"]
    inside = run_cli("select", flagged, os.path.join(flagged, "dst"), "--columns", "key")
    assert inside.exit_code == 2 and not os.path.exists(os.path.join(flagged, "dst"))


@pytest.mark.parametrize("to", ["tfrecord", "arrow"])
def test_other_formats(tmp_path, run_cli, flagged, to):
    result = run_cli("filter", flagged, tmp_path / "out", "--column", "keep", "--to", to, "-q")
    assert result.exit_code == 0 and result.stderr == ""
    assert any(f.startswith("part-") for f in os.listdir(tmp_path / "out"))


@pytest.mark.parametrize("op, keys, flags", [
    ("filter", 'column = "keep"', ["--column", "keep"]),
    ("select", 'columns = ["label", "key"]', ["--columns", "label,key"]),
    ("rename", 'columns = {label = "class"}', ["--columns", "label=class"]),
])
def test_command_writes_what_the_pipeline_stage_writes(tmp_path, run_cli, flagged, op, keys, flags):
    (tmp_path / "p.toml").write_text(f'[input]\npath = "{flagged}"\n[[stage]]\nop = "{op}"\n{keys}\n'
                                     f'[output]\npath = "{tmp_path / "piped"}"\n')
    assert run_cli("run", tmp_path / "p.toml", "-q", "--threads", "2").exit_code == 0
    assert run_cli(op, flagged, tmp_path / "direct", *flags, "-q").exit_code == 0
    assert data_bytes(str(tmp_path / "piped")) == data_bytes(str(tmp_path / "direct"))


def test_option_errors_name_a_field_rendered_per_front_end():
    with pytest.raises(OptionError) as caught:
        build_options(RenameOptions, {"columns": {"a": "x", "b": "x"}})
    assert caught.value.field == "columns"
    assert str(caught.value) == "--columns: two columns are renamed to the same name (x, x)"
    assert caught.value.rendered("toml") == "key 'columns': two columns are renamed to the same name (x, x)"
    assert build_options(SelectOptions, {"columns": "a, b"}) == SelectOptions(("a", "b"))
    with pytest.raises(OptionError, match="missing"):
        build_options(SelectOptions, {})


def test_pipeline_rejects_unknown_and_missing_keys(tmp_path, run_cli, flagged):
    for keys, message in [("colum = 'keep'", "unknown key 'colum' (did you mean 'column'?)"),
                          ("", "missing key 'column'"),
                          ("column = 3", "key 'column': expected a column name, got integer 3")]:
        (tmp_path / "p.toml").write_text(f'[input]\npath = "{flagged}"\n[[stage]]\nop = "filter"\n{keys}\n'
                                         f'[output]\npath = "{tmp_path / "out"}"\n')
        result = run_cli("run", tmp_path / "p.toml")
        assert result.exit_code == 2 and f"stage 1 (filter): {message}" in result.stderr, result.stderr


def _chunk(batch: pa.RecordBatch) -> Chunk:
    return Chunk(batch, rng.example_ids(0, 0, batch.num_rows))


@settings(max_examples=40, deadline=None)
@given(record_batches())
def test_select_then_rename_keeps_every_row_and_value(batch):
    names = batch.schema.names[::-1]
    select, rename = OPERATIONS["select"], OPERATIONS["rename"]
    chosen = SelectOptions(tuple(names))
    renames = RenameOptions(tuple((n, n.upper()) for n in names))
    schema = rename.output_schema(renames, select.output_schema(chosen, batch.schema))
    selected, stats1 = select.kernel(chosen, _chunk(batch))
    out, stats2 = rename.kernel(renames, selected)
    assert out.data.schema == schema
    assert stats1.counts == stats2.counts == {"rows_in": batch.num_rows, "rows_out": batch.num_rows}
    assert np.array_equal(out.ids, rng.example_ids(0, 0, batch.num_rows))
    for name in names:
        assert out.data.column(name.upper()).equals(batch.column(name))


@pytest.mark.parametrize("kind, given, message", [
    (Flag(), 1, "expected true or false, got integer 1"),
    (Number(), "0.5", "expected a number, got string '0.5'"),
    (Integer(), 2.5, "expected an integer, got number 2.5"),
    (NumberOrColumn(), True, "expected a number or a column name, got boolean True"),
    (Column(), ["a"], "expected a column name, got list ['a']"),
    (ColumnList(), {"a": 1}, "expected a non-empty list of column names, got table {'a': 1}"),
    (Pairs("OLD=NEW", names=True), {"a": 3}, "expected a table of old = \"new\" names, got table {'a': 3}"),
])
def test_a_pipeline_value_of_the_wrong_kind_is_named_by_its_key(kind, given, message):
    """TOML values are checked, never converted: a string "0.5" is not a number."""
    with pytest.raises(OptionError) as caught:
        kind.parse("some_option", given)
    assert caught.value.rendered("toml") == f"key 'some-option': {message}"


@pytest.mark.parametrize("kind, text, message", [
    (Number(), "abc", "--some-option: 'abc' is not a number"),
    (Integer(), "1.5", "--some-option: '1.5' is not an integer"),
])
def test_command_line_text_that_is_not_a_number(kind, text, message):
    with pytest.raises(OptionError, match=message):
        kind.from_text("some_option", text)
    assert NumberOrColumn().from_text("rate", "1e3") == 1000.0


def test_one_pairs_kind_serves_every_key_value_option():
    """Renames, output names, pad values and initial states are one kind: named pairs (split on commas, each
    side non-empty, duplicates refused as told) or texts kept whole for a check that needs the schema."""
    renames = Pairs("OLD=NEW", names=True, split=True, twice="renamed twice ({})", same="same name ({})")
    assert renames.parse("columns", ["a=b, c=d", "e = f"]) == (("a", "b"), ("c", "d"), ("e", "f"))
    assert renames.parse("columns", {"a": "b"}) == (("a", "b"),)
    for given, message in [(["a=b,a=c"], "--columns: renamed twice (a, a)"),
                           ("a=c,b=c", "--columns: same name (c, c)"),
                           ("a=b,=c", "--columns '=c': expected OLD=NEW"),
                           ("a=b,", "--columns: 'a=b,' has an empty pair (give OLD=NEW or OLD=NEW,OLD=NEW,...)"),
                           ({}, "--columns: expected a table of old = \"new\" names, got table {}")]:
        with pytest.raises(OptionError) as caught:
            renames.parse("columns", given)
        assert str(caught.value) == message
    texts = Pairs("COL=V")
    assert texts.parse("pad_value", {"tokens": -1, "words": "<pad>"}) == ("tokens=-1", "words=<pad>")
    assert texts.parse("pad_value", "words=<a,b>") == ("words=<a,b>",)  # a value may hold commas
    with pytest.raises(OptionError) as caught:
        texts.parse("pad_value", [1])
    assert caught.value.rendered("toml") == "key 'pad-value': expected COL=V pairs, got list [1]"
