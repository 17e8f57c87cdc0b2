"""Options that behave the same on every command: column lists in both forms, segment's default context,
stratify's exact totals, and usage errors as one `error:` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, data_bytes, read_dir, write_parquet_shards

from batchtool.cli import cli
from batchtool.cli.common import make_output
from batchtool.core.errors import UsageError
from batchtool.core.options import fields
from batchtool.pipeline import load
from batchtool.exec.settings import OutputSettings, parse_size, size_text
from batchtool.core.synthetic import make_table

SEGMENT = ("--key", "key", "--num-unroll", "6", "--batch-size", "4", "-q")


def manifest(path) -> dict:
    return json.load(open(os.path.join(path, ".batchtool_manifest.json")))


def one_error_line(result, *parts: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(p in lines[0] for p in parts), lines[0]
    return lines[0]


@pytest.mark.parametrize("forms", [
    ("--sequence", "tokens,frames"),
    ("--sequence", "tokens", "--sequence", "frames"),
    ("--sequence", "tokens", "--sequence", "frames,tokens"),  # mixed, a name twice: counted once
])
def test_segment_sequences_in_any_form(tmp_path, parquet_src, run_cli, forms):
    result = run_cli("segment", parquet_src, tmp_path / "dst", *forms, "--context", "label", *SEGMENT)
    assert result.exit_code == 0, result.stderr
    assert manifest(tmp_path / "dst")["options"]["sequences"] == ["tokens", "frames"]
    reference = tmp_path / "ref"
    assert run_cli("segment", parquet_src, reference, "--sequence", "tokens,frames", "--context", "label",
                   *SEGMENT).exit_code == 0
    assert data_bytes(tmp_path / "dst") == data_bytes(reference)


def test_bucket_takes_the_comma_form_too(tmp_path, parquet_src, run_cli):
    common = ("--length", "tokens", "--boundaries", "10,20", "--batch-size", "8", "-q")
    assert run_cli("bucket", parquet_src, tmp_path / "a", "--sequence", "tokens,frames", *common).exit_code == 0
    assert run_cli("bucket", parquet_src, tmp_path / "b", "--sequence", "tokens", "--sequence", "frames",
                   *common).exit_code == 0
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")


def test_convert_columns_repeated_and_comma_keep_the_order(tmp_path, parquet_src, run_cli):
    result = run_cli("convert", parquet_src, tmp_path / "dst", "--columns", "weight", "--columns", "key,label", "-q")
    assert result.exit_code == 0, result.stderr
    assert read_dir(str(tmp_path / "dst")).schema.names == ["weight", "key", "label"]


def test_check_column_lists_both_forms(parquet_src, run_cli):
    comma = run_cli("check", parquet_src, "--no-nulls", "key,label", "--json", "-")
    repeated = run_cli("check", parquet_src, "--no-nulls", "key", "--no-nulls", "label", "--json", "-")
    assert comma.exit_code == repeated.exit_code == 0
    assert json.loads(comma.stdout)["rules"] == json.loads(repeated.stdout)["rules"]


def test_an_empty_column_name_is_refused(tmp_path, parquet_src, run_cli):
    result = run_cli("segment", parquet_src, tmp_path / "dst", "--sequence", "tokens,,frames", *SEGMENT)
    one_error_line(result, "--sequence", "'tokens,,frames' has an empty column name")
    assert not (tmp_path / "dst").exists()


def test_pipeline_sequence_key_as_list_or_comma_string(tmp_path, parquet_src, run_cli):
    outputs = []
    for i, value in enumerate(['["tokens", "frames"]', '"tokens,frames"']):
        path = tmp_path / f"p{i}.toml"
        path.write_text(f'[input]\npath = "{parquet_src}"\n[[stage]]\nop = "segment"\nkey = "key"\n'
                        f'sequence = {value}\nnum-unroll = 6\nbatch-size = 4\n[output]\npath = "{tmp_path}/o{i}"\n')
        assert run_cli("run", path, "-q").exit_code == 0
        outputs.append(data_bytes(tmp_path / f"o{i}"))
    assert outputs[0] == outputs[1]


def test_segment_keeps_every_other_column_as_context_by_default(tmp_path, parquet_src, run_cli):
    assert run_cli("segment", parquet_src, tmp_path / "all", "--sequence", "tokens,frames", *SEGMENT).exit_code == 0
    out = read_dir(str(tmp_path / "all"))
    assert {"label", "weight"} <= set(out.schema.names)
    assert manifest(tmp_path / "all")["options"]["context"] == ["label", "weight"]
    first = {r["key"].partition(":")[2]: r for r in out.to_pylist() if r["sequence"] == 0 and r["key"]}
    source = {r["key"]: r for r in pq.read_table(parquet_src).to_pylist()}
    assert len(first) == len(source) and all(first[k]["weight"] == pytest.approx(source[k]["weight"]) for k in first)
    assert run_cli("segment", parquet_src, tmp_path / "named", "--sequence", "tokens,frames", "--context", "label",
                   *SEGMENT).exit_code == 0
    assert "weight" not in read_dir(str(tmp_path / "named")).schema.names


def test_segment_refuses_a_default_context_column_named_like_an_output_column(tmp_path, corpus, run_cli):
    src = write_parquet_shards(str(tmp_path / "src"), corpus.append_column("length", pa.array([1.5] * len(corpus))))
    result = run_cli("segment", src, tmp_path / "dst", "--sequence", "tokens", *SEGMENT)
    one_error_line(result, "column 'length' is also an output column of segment", "--output-column length=NEW_NAME",
                   "--input-length", "--context")
    assert not (tmp_path / "dst").exists()


def classes_table(counts: list[int]) -> pa.Table:
    labels = np.repeat(np.arange(len(counts)), counts)
    return pa.table({"key": [f"k{i}" for i in range(len(labels))], "label": labels})


def test_stratify_exact_gives_exact_proportions_when_the_counts_allow(tmp_path, run_cli):
    src = write_parquet_shards(str(tmp_path / "src"), classes_table([2709, 199, 62, 30]), shards=2,
                               row_group_size=500)
    result = run_cli("stratify", src, tmp_path / "dst", "--target", "0.4,0.3,0.2,0.1", "-q")
    assert result.exit_code == 0, result.stderr
    stats = manifest(tmp_path / "dst")["stats"]
    assert stats["class_counts_after"] == {"0": 120, "1": 90, "2": 60, "3": 30} and stats["total_m"] == 300
    labels = read_dir(str(tmp_path / "dst")).column("label").to_numpy()
    assert np.bincount(labels).tolist() == [120, 90, 60, 30]


def test_stratify_string_labels_name_the_file(tmp_path, run_cli):
    src = write_parquet_shards(str(tmp_path / "src"), pa.table({"label": ["a", "b"]}), shards=1)
    one_error_line(run_cli("stratify", src, tmp_path / "dst", "--target", "uniform"),
                   "part-00000.parquet, column 'label': type string")


@pytest.mark.parametrize("args, parts", [
    (["bucket", "SRC", "DST", "--batchsize", "3"], ["No such option '--batchsize'", "Did you mean", "'--batch-size'",
                                                     "bucket --help"]),
    (["shuffle", "SRC", "DST", "--memory", "abc"], ["'--memory'", "'abc' is not a size"]),
    (["segment", "SRC"], ["Missing argument 'DST'", "segment --help"]),
    (["convert", "SRC", "DST", "--to", "csv"], ["'--to'", "'csv' is not one of"]),
    (["bogus"], ["No such command 'bogus'"]),
    (["--bogus"], ["No such option '--bogus'"]),
    (["check", "SRC", "--min-rows", "x"], ["'--min-rows'", "'x' is not a valid integer"]),
    (["convert", "SRC", "DST", "--columns"], ["Option '--columns' requires an argument", "convert --help"]),
])
def test_usage_errors_are_one_line(tmp_path, parquet_src, run_cli, args, parts):
    args = [parquet_src if a == "SRC" else tmp_path / "dst" if a == "DST" else a for a in args]
    one_error_line(run_cli(*args), *parts)
    assert not (tmp_path / "dst").exists()


def test_usage_error_through_the_real_entry_point(tmp_path, parquet_src):
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "batchtool", "bucket", parquet_src, str(tmp_path / "dst"),
                           "--batchsize", "3"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "--batch-size" in proc.stderr


def test_make_table_has_the_columns_these_tests_name():
    assert make_table(2, seed=1).schema.names == ["key", "label", "weight", "tokens", "frames"]


# -- the settings every command shares: one schema for the command line and a pipeline file --------------------

OUTPUT_SETTINGS = [  # (flag, its text, the pipeline key, its TOML value)
    ("--to", "tfrecord", "format", '"tfrecord"'), ("--compression", "gzip", "compression", '"gzip"'),
    ("--shard-rows", "7", "shard-rows", "7"), ("--shard-bytes", "1MB", "shard-bytes", '"1MB"'),
    ("--tfrecord-kind", "example", "tfrecord-kind", '"example"'), ("--cast", "float64=float32", "cast",
                                                                   '"float64=float32"'),
    ("--overwrite", None, "overwrite", "true"),
]


def settings_pipeline(tmp_path, top: str = "", input: str = 'path = "src"', output: str = "") -> str:
    path = tmp_path / "p.toml"
    path.write_text(f'{top}\n[input]\n{input}\n[[stage]]\nop = "select"\ncolumns = "key"\n'
                    f'[output]\npath = "out"\n{output}\n')
    return str(path)


def test_output_flags_and_output_keys_make_the_same_writer_options(tmp_path):
    args = [a for flag, text, _, _ in OUTPUT_SETTINGS for a in (flag, text) if a is not None]
    ctx = cli.commands["convert"].make_context("convert", ["src", "dst", *args])
    from_flags = make_output(dict(ctx.params))
    keys = "\n".join(f"{key} = {value}" for _, _, key, value in OUTPUT_SETTINGS)
    from_keys = load(settings_pipeline(tmp_path, output=keys)).output
    assert from_flags == from_keys
    assert (from_keys.format, from_keys.codec, from_keys.shard_rows, from_keys.shard_bytes, from_keys.writing.tfrecord_kind,
            from_keys.cast, from_keys.overwrite) == ("tfrecord", "gzip", 7, 1 << 20, "example", ("float64=float32",),
                                                     True)


def test_every_output_flag_is_an_output_key_with_the_same_help():
    params = {opt: p for name in ("convert", "bucket") for p in cli.commands[name].params for opt in p.opts}
    for f, decl in fields(OutputSettings):
        param = params[OutputSettings.FLAGS.get(f.name, "--" + f.name.replace("_", "-"))]
        assert param.help.startswith(decl.help.rstrip("."))


@pytest.mark.parametrize("flags, cli_parts, keys, toml_message", [
    (["--shard-rows", "0"], ["'--shard-rows'", "0 is not in the range x>=1"], "shard-rows = 0",
     "[output]: key 'shard-rows': 0 must be at least 1"),
    (["--shard-bytes", "lots"], ["'--shard-bytes'", "'lots' is not a size (e.g. 256MB, 1GB, 1000000)"],
     'shard-bytes = "lots"', "[output]: key 'shard-bytes': 'lots' is not a size (e.g. 256MB, 1GB, 1000000)"),
    (["--shard-bytes", "0"], ["error: --shard-bytes 0: must be positive"], "shard-bytes = 0",
     "[output]: key 'shard-bytes' = 0: must be positive"),
    (["--cast", "float64=float32"], ["error: --cast float64=float32: only TFRecord output narrows values"],
     'cast = "float64=float32"',
     "[output]: key 'cast' = float64=float32: only TFRecord output narrows values; parquet keeps them exactly"),
    (["--compression", "lzma"], ["error: --compression 'lzma': Parquet takes zstd"], 'compression = "lzma"',
     "[output]: compression 'lzma': Parquet takes zstd, snappy, gzip, lz4, brotli, none"),
    (["--tfrecord-kind", "proto"], ["'--tfrecord-kind'", "'proto' is not one of"], 'tfrecord-kind = "proto"',
     "[output]: key 'tfrecord-kind' = 'proto': expected one of sequence_example, example"),
])
def test_a_bad_output_setting_names_the_flag_or_the_key(tmp_path, parquet_src, run_cli, flags, cli_parts, keys,
                                                        toml_message):
    one_error_line(run_cli("convert", parquet_src, tmp_path / "dst", *flags), *cli_parts)
    assert not (tmp_path / "dst").exists()
    path = settings_pipeline(tmp_path, output=keys)
    with pytest.raises(UsageError) as caught:
        load(path)
    assert str(caught.value) == f"{path}: {toml_message}"


@pytest.mark.parametrize("top, input, message", [
    ("threads = 0", "", "key 'threads': 0 must be at least 1"),
    ("memory = 1.5", "", "key 'memory': expected a size (e.g. 256MB, 1GB, 1000000), got number 1.5"),
    ("", 'path = "src"\nformat = "csv"', "[input]: key 'format' = 'csv': expected one of parquet, tfrecord, arrow"),
    ("", 'path = "src"\nskip-corrupt = 1', "[input]: key 'skip-corrupt': expected true or false, got integer 1"),
    ("", "path = 3", "[input]: key 'path': expected a string, got integer 3"),
    ("", 'format = "parquet"', "[input]: missing key 'path'"),
])
def test_a_bad_top_level_or_input_key_names_it(tmp_path, top, input, message):
    path = settings_pipeline(tmp_path, top=top, **({"input": input} if input else {}))
    with pytest.raises(UsageError) as caught:
        load(path)
    assert str(caught.value) == f"{path}: {message}"


def test_the_output_format_key_is_format_not_the_flags_name(tmp_path):
    path = settings_pipeline(tmp_path, output='to = "arrow"')
    with pytest.raises(UsageError) as caught:
        load(path)
    assert str(caught.value) == f"{path}: [output]: unknown key 'to' (did you mean 'format'?)"


def test_top_level_and_input_keys_take_the_commands_values(tmp_path):
    config = load(settings_pipeline(tmp_path, top='memory = 65536\nthreads = 2\ntmp-dir = "spill"',
                                    input='path = "src"\nformat = "parquet"\nskip-corrupt = true\n'
                                          'columns = ["key", "label"]'))
    assert (config.memory, config.threads, config.tmp_dir) == (65536, 2, str(tmp_path / "spill"))
    assert (config.input.path, config.input.format, config.input.skip_corrupt, config.input.columns) == (
        str(tmp_path / "src"), "parquet", True, ("key", "label"))


@pytest.mark.parametrize("size, text", [(1 << 30, "1GB"), (256 << 20, "256MB"), (1536, "1536"), (3 << 10, "3KB"),
                                        (0, "0")])
def test_sizes_read_as_written_and_show_in_whole_units(size, text):
    assert size_text(size) == text and parse_size(text) == size == parse_size(size)
    assert parse_size("1.5GiB") == 3 << 29 and parse_size(" 2 mb ") == 2 << 20
    with pytest.raises(ValueError, match="'12XB' is not a size"):
        parse_size("12XB")


@pytest.mark.parametrize("command, args, key", [
    ("bucket", ["--boundaries", "9999999999999999999", "--batch-size", "4"], "boundaries"),
    ("segment", ["--key", "key", "--sequence", "tokens", "--num-unroll", "9999999999999999999", "--batch-size", "4"],
     "num-unroll"),
])
def test_an_integer_beyond_64_bits_is_one_line_on_the_command_line_and_in_a_pipeline(tmp_path, parquet_src, run_cli,
                                                                                      command, args, key):
    result = run_cli(command, parquet_src, tmp_path / "dst", *args)
    one_error_line(result, f"--{key} 9999999999999999999: must fit in 64 bits (at most 9223372036854775807)")
    pipeline = tmp_path / "p.toml"
    keys = dict(zip(args[::2], args[1::2]))
    body = "\n".join(f"{k[2:]} = {v if v.lstrip('-').isdigit() else repr(v)}" for k, v in keys.items())
    pipeline.write_text(f'[input]\npath = "{parquet_src}"\n[[stage]]\nop = "{command}"\n{body}\n'
                        f'[output]\npath = "{tmp_path / "dst"}"\n')
    for extra in ([], ["--dry-run"]):
        one_error_line(run_cli("run", pipeline, *extra), f"key '{key}' = 9999999999999999999: must fit in 64 bits")
    assert sorted(os.listdir(tmp_path)) == ["p.toml", "src"]


@pytest.mark.parametrize("command, args", [("shuffle", ["DST", "--memory", "1e400GB"]),
                                           ("check", ["--unique", "key", "--memory", "1e400GB"])])
def test_a_size_too_large_for_a_number_is_one_line(tmp_path, parquet_src, run_cli, command, args):
    result = run_cli(command, parquet_src, *[tmp_path / "dst" if a == "DST" else a for a in args])
    one_error_line(result, "'1e400GB' is not a size")
    assert sorted(os.listdir(tmp_path)) == ["src"]
