"""The one TOML reader (pipelines, check rules): nesting and dotted keys bounded before the parser recurses or
slows down, strings and comments not mistaken for structure, every failure one error naming the file."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.errors import InputError, UsageError
from batchtool.core.tomlfile import MAX_BYTES, MAX_DEPTH, read_toml
from conftest import SAMPLE

NESTED, DOTTED = f"arrays and tables nested more than {MAX_DEPTH} deep", f"a dotted key of more than {MAX_DEPTH} parts"
DEEP = {
    "arrays": ("a = " + "[" * 5000 + "]" * 5000, NESTED),
    "inline tables": ("a = " + "{b = " * 5000 + "1" + "}" * 5000, NESTED),
    "table headers": ("[" * 5000 + "a" + "]" * 5000, NESTED),
    "dotted key": ("a" + ".a" * 20_000 + " = 1", DOTTED),
    "dotted table header": ("[a" + ".a" * 20_000 + "]", DOTTED),
}


def _write(tmp_path, text: str, name: str = "f.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, problem", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_is_refused_before_the_parser_runs(tmp_path, text, problem):
    """tomllib recurses per bracket (RecursionError) and is quadratic in a dotted key's parts (20,000 parts: 11 s)."""
    path = _write(tmp_path, text)
    started = time.perf_counter()
    with pytest.raises(UsageError) as err:
        read_toml(path, "rules file")
    assert time.perf_counter() - started < 1.0  # a hang guard: the scan is linear, the parser never runs
    assert str(err.value) == f"{path}, line 1: {problem}"


def test_nesting_that_dotted_keys_and_tables_add_up_to_is_measured_after_parsing(tmp_path):
    """Each part is within the limits, the document is not: 20 dotted parts, then 20 tables inside each other."""
    text = "a" + ".a" * 19 + " = " + "{b = " * 20 + "1" + "}" * 20
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as err:
        read_toml(path, "pipeline file")
    assert str(err.value) == f"{path}: arrays and tables nested more than {MAX_DEPTH} deep"


def test_limits_are_inclusive(tmp_path):
    assert read_toml(_write(tmp_path, "a = " + "[" * MAX_DEPTH + "]" * MAX_DEPTH), "f")["a"] is not None
    assert read_toml(_write(tmp_path, ".".join(["a"] * MAX_DEPTH) + " = 1"), "f")["a"]["a"] is not None
    with pytest.raises(UsageError, match="nested more than"):
        read_toml(_write(tmp_path, "a = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)), "f")


def test_brackets_and_dots_in_strings_and_comments_are_text(tmp_path):
    many = "[{." * 2000
    text = (f"a = \"{many}\\\"{many}\"\nb = '{many}'\n# {many}\nc = \"\"\"\n{many}\"\"\"\"\n"
            f"d = '''{many}''''\n\"{many}\" = 1\n")
    doc = read_toml(_write(tmp_path, text), "f")
    assert doc == {"a": f'{many}"{many}', "b": many, "c": many + '"', "d": many + "'", many: 1}


_KEYS = st.text(st.sampled_from("ab.[]{}\"'#\\ \n"), max_size=4)
_LEAVES = st.integers(-5, 5) | st.text(st.sampled_from("a.[]{}\"'#\\=, \n\té"), max_size=6)


def _nested(depth: int) -> st.SearchStrategy:
    if depth == 0:
        return _LEAVES
    inner = _nested(depth - 1)
    return _LEAVES | st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3)


def _toml(value: object) -> str:
    """A value as TOML: JSON's strings are TOML basic strings; arrays and inline tables."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _depth(value: object) -> int:
    if isinstance(value, (list, dict)):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in children), default=0)
    return 0


@settings(max_examples=40)
@given(value=_nested(6), wrap=st.integers(0, MAX_DEPTH + 2))
def test_any_document_within_the_limit_reads_as_written_and_none_beyond(tmp_path_factory, value, wrap):
    """Whatever strings hold, the scan counts only real nesting: a document `wrap` arrays deeper than `value` reads
    back equal when it nests at most MAX_DEPTH deep, and is refused otherwise."""
    document = {"k": value}
    for _ in range(wrap):
        document = {"k": [document["k"]]}
    path = _write(tmp_path_factory.getbasetemp(), f"k = {_toml(document['k'])}\n", "doc.toml")
    if _depth(document["k"]) <= MAX_DEPTH:
        assert read_toml(path, "f") == document
    else:
        with pytest.raises(UsageError, match=f"nested more than {MAX_DEPTH} deep"):
            read_toml(path, "f")


def test_unreadable_large_and_invalid_files_name_the_file(tmp_path):
    with pytest.raises(InputError, match=r"nope.toml: no such pipeline file$"):
        read_toml(str(tmp_path / "nope.toml"), "pipeline file")
    with pytest.raises(InputError, match="cannot read the rules file"):
        read_toml(str(tmp_path), "rules file")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:  # sparse: never written, and never read past the limit
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(UsageError, match=f"big.toml: more than {MAX_BYTES:,} bytes, too large for a rules file"):
        read_toml(str(big), "rules file")
    for text, problem in [(b"a = [[1]\n", "Unclosed array"), (b"a = '\xff'", "invalid start byte"),
                          (b'a = "' + b'\\"' * 1000, "Unterminated string")]:
        (tmp_path / "bad.toml").write_bytes(text)
        with pytest.raises(UsageError, match=rf"bad.toml: not valid TOML \(.*{problem}"):
            read_toml(str(tmp_path / "bad.toml"), "rules file")


@pytest.mark.parametrize("command", [("run",), ("check", os.path.join(SAMPLE, "parquet"), "--rules")])
@pytest.mark.parametrize("text, problem", [DEEP["arrays"], DEEP["dotted key"]], ids=["arrays", "dotted key"])
def test_a_deeply_nested_pipeline_or_rules_file_is_one_error_exit_2(tmp_path, run_cli, command, text, problem):
    path = _write(tmp_path, text)
    result = run_cli(*command, path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}, line 1: {problem}\n" and result.stdout == ""
