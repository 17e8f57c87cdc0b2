"""batchtool pack end to end: summary, inspect, check, identical bytes for any --threads and --memory,
TFRecord output, the pipeline stage and its dry run, and errors (exit 2, one line, DST untouched)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

import batchtool
from conftest import data_bytes, read_dir, write_parquet_shards

ARGS = ["--max-length", "128", "--split-long", "--batch-size", "4"]


def test_summary_manifest_inspect_and_check(tmp_path, parquet_src, run_cli):
    dst = tmp_path / "out"
    result = run_cli("pack", parquet_src, dst, *ARGS)
    assert result.exit_code == 0, result.stderr
    stats = json.loads((dst / ".batchtool_manifest.json").read_text())["stats"]
    assert (f"{stats['rows']:,} packed rows (lower bound {stats['rows_lower_bound']:,}), packing efficiency "
            f"{100 * stats['packing_efficiency']:.2f}%") in result.stderr
    assert f"{stats['examples_split']} split into pieces" in result.stderr and stats["examples_split"] > 0
    shown = run_cli("inspect", dst)
    assert "packing (efficiency = real steps / (rows x max length))" in shown.output
    assert f"{stats['rows']:,} rows of at most 128 steps" in shown.output and "examples per row" in shown.output
    rules = tmp_path / "rules.toml"
    for bound, status in ((0.9, 0), (1.0, 1)):
        rules.write_text(f'[[rules]]\nkind = "packing_efficiency"\nmin = {bound}\n')
        checked = run_cli("check", dst, "--rules", rules)
        assert checked.exit_code == status and f"{stats['packing_efficiency']:.4f}" in checked.output


@pytest.mark.parametrize("to", ["parquet", "tfrecord"])
def test_threads_and_memory_do_not_change_the_bytes(tmp_path, parquet_src, run_cli, to):
    runs = {"t1": ("--threads", "1"), "t2": ("--threads", "2"), "small": ("--threads", "2", "--memory", "16KB")}
    for name, extra in runs.items():
        assert run_cli("pack", parquet_src, tmp_path / name, *ARGS, "--to", to, "-q", *extra).exit_code == 0
    assert data_bytes(str(tmp_path / "t1")) == data_bytes(str(tmp_path / "t2")) == data_bytes(str(tmp_path / "small"))


def test_tfrecord_output_loads_as_the_same_batches(tmp_path, parquet_src, run_cli):
    for to in ("parquet", "tfrecord"):
        assert run_cli("pack", parquet_src, tmp_path / to, *ARGS, "--to", to, "-q").exit_code == 0
    parquet = list(batchtool.load(str(tmp_path / "parquet")))
    tfrecord = list(batchtool.load(str(tmp_path / "tfrecord")))
    assert len(parquet) == len(tfrecord) > 1
    for a, b in zip(parquet, tfrecord):
        for name in ("tokens", "frames", "segment_ids", "positions", "length", "num_examples", "batch"):
            assert np.array_equal(a[name], b[name]), name
        assert [list(x) for x in a["key"]] == [list(x) for x in b["key"]]


def test_pipeline_stage_equals_the_commands_and_its_dry_run_the_result(tmp_path, parquet_src, run_cli):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(f'seed = 5\n[input]\npath = "{parquet_src}"\n'
                        '[[stage]]\nop = "shuffle"\n'
                        '[[stage]]\nop = "pack"\nmax-length = 128\nsplit-long = true\nmax-tokens = 1024\n'
                        f'[output]\npath = "{tmp_path / "piped"}"\n')
    dry = run_cli("run", pipeline, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert run_cli("run", pipeline, "-q").exit_code == 0
    assert run_cli("shuffle", parquet_src, tmp_path / "shuffled", "--seed", "5", "-q").exit_code == 0
    assert run_cli("pack", tmp_path / "shuffled", tmp_path / "chained", "--max-length", "128", "--split-long",
                   "--max-tokens", "1024", "--seed", "5", "-q").exit_code == 0
    assert data_bytes(str(tmp_path / "piped")) == data_bytes(str(tmp_path / "chained"))
    stage = json.loads((tmp_path / "piped" / ".batchtool_manifest.json").read_text())["stats"]["stages"][-1]
    assert (f"{stage['rows']:,} packed rows (lower bound {stage['rows_lower_bound']:,}), packing efficiency "
            f"{100 * stage['packing_efficiency']:.2f}%, padding efficiency {100 * stage['padding_efficiency']:.1f}% "
            "(expected)") in dry.output
    assert f"{stage['batches']:,} batches" in dry.output


@pytest.mark.parametrize("args, message", [
    (["--max-length", "100", "--batch-size", "4"],
     "part-00000.parquet, row 49, column 'tokens': 149 steps, more than --max-length 100 (pass --split-long"),
    (["--max-length", "0", "--batch-size", "4"], "--max-length 0: must be between 1 and 4,194,304"),
    (["--max-length", "512", "--batch-size", "4", "--max-examples-per-row", "0"],
     "--max-examples-per-row 0: must be at least 1"),
    (["--max-length", "512", "--batch-size", "4", "--split-long", "--drop-long"],
     "give at most one of --split-long and --drop-long"),
    (["--max-length", "512", "--batch-size", "4", "--max-tokens", "1024"],
     "error: give at most one of --batch-size and --max-tokens"),
    (["--max-length", "512", "--max-tokens", "100"], "--max-tokens 100: must be between --max-length (512"),
    (["--max-length", "512", "--batch-size", "4", "--sequence", "label"],
     "--sequence label: column is int64, expected a list (sequence) column"),
    (["--max-length", "512", "--batch-size", "4", "--pad-value", "key=x", "--sequence", "tokens"],
     "--pad-value key=...: column 'key' is not packed"),
    (["--max-length", "4194304", "--pad-to-max-length", "--batch-size", "8", "--max-examples-per-row", "1"],
     "--batch-size 8: one batch of 8 rows padded to --max-length 4,194,304 steps (--pad-to-max-length) takes about "
     "1.9 GB at once, more than --memory 1.0 GB allows (128.0 MB); give a smaller --batch-size or --max-length, "
     "drop --pad-to-max-length, or a larger --memory"),
    (["--max-length", "1000000", "--max-tokens", "2000000000", "--pad-to-max-length", "--max-examples-per-row", "1"],
     "--max-tokens 2000000000: one batch of 300 rows padded to --max-length 1,000,000 steps (--pad-to-max-length) "
     "takes about 17.0 GB"),
])
def test_errors_exit_2_with_one_line_and_leave_dst_untouched(tmp_path, parquet_src, run_cli, args, message):
    fresh, kept = tmp_path / "fresh", tmp_path / "kept"
    kept.mkdir()
    (kept / "marker").write_text("mine")
    for dst, extra in ((fresh, []), (kept, ["--overwrite"])):
        result = run_cli("pack", parquet_src, dst, *args, *extra)
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and message in result.stderr
    assert not fresh.exists() and os.listdir(kept) == ["marker"]
    assert sorted(os.listdir(tmp_path)) == ["kept", "src"]


def test_drop_long_is_counted(tmp_path, parquet_src, run_cli):
    result = run_cli("pack", parquet_src, tmp_path / "out", "--max-length", "64", "--drop-long", "--batch-size", "8")
    stats = json.loads((tmp_path / "out" / ".batchtool_manifest.json").read_text())["stats"]
    long = stats["lengths_in"]["longer_than_max_length"]
    assert long > 0 and stats["examples_dropped"] == {"long": long} and f"{long} dropped ({long} long)" in result.stderr
    keys = read_dir(str(tmp_path / "out")).column("key").to_pylist()
    assert stats["examples_packed"] == 300 - long == sum(len(k) for k in keys)


def test_tfrecord_example_output_for_flat_sequences(tmp_path, parquet_src, run_cli):
    """tf.train.Example holds no feature lists: flat sequences pack into Examples and load back."""
    assert run_cli("convert", parquet_src, tmp_path / "flat", "--columns", "key,label,tokens", "-q").exit_code == 0
    assert run_cli("pack", tmp_path / "flat", tmp_path / "ex", *ARGS, "--to", "tfrecord", "--tfrecord-kind", "example",
                   "-q").exit_code == 0
    assert run_cli("pack", tmp_path / "flat", tmp_path / "pq", *ARGS, "-q").exit_code == 0
    for a, b in zip(batchtool.load(str(tmp_path / "ex")), batchtool.load(str(tmp_path / "pq")), strict=True):
        assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["segment_ids"], b["segment_ids"])


def test_readme_synopsis_runs_with_batches_of_8_rows(tmp_path, parquet_src, run_cli):
    """`batchtool pack SRC DST --max-length L`, as README's command table gives it: 8 rows a batch by default."""
    result = run_cli("pack", parquet_src, tmp_path / "out", "--max-length", "128", "--split-long")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / ".batchtool_manifest.json").read_text())
    assert manifest["options"]["batch_size"] == 8 and manifest["options"]["max_tokens"] is None
    loaded = batchtool.load(str(tmp_path / "out"))
    rows = dict(sorted((int(batch["batch"][0]), len(batch["length"])) for batch in loaded))
    assert list(rows) == list(range(manifest["stats"]["batches"])) and len(rows) > 2
    assert set(list(rows.values())[:-1]) == {8} and 1 <= rows[len(rows) - 1] <= 8


def test_columns_keeps_only_those_besides_the_sequences(tmp_path, parquet_src, run_cli, corpus):
    """--columns key: label and weight are neither read nor written; `frames`, a list column not packed (--sequence
    tokens) and not named, goes too; an input column named like one of pack's own is no clash when left out."""
    src = write_parquet_shards(str(tmp_path / "with_positions"),
                               corpus.append_column("positions", corpus.column("label")))
    args = ["--max-length", "128", "--split-long", "--sequence", "tokens", "-q"]
    assert run_cli("pack", src, tmp_path / "out", *args, "--columns", "key").exit_code == 0
    out = read_dir(str(tmp_path / "out"))
    assert out.schema.names == ["key", "tokens", "source_offset", "segment_ids", "positions", "cu_seqlens",
                                "num_examples", "length", "batch"]
    keys = [k for row in out.column("key").to_pylist() for k in row]
    offsets = [o for row in out.column("source_offset").to_pylist() for o in row]
    assert sorted(k for k, o in zip(keys, offsets) if o == 0) == sorted(corpus.column("key").to_pylist())
    options = json.loads((tmp_path / "out" / ".batchtool_manifest.json").read_text())["options"]
    assert options["columns"] == ["key"]
    clash = run_cli("pack", src, tmp_path / "clash", *args, "--columns", "key,positions")
    assert clash.exit_code == 2 and "column 'positions' is also an output column of pack" in clash.stderr
    missing = run_cli("pack", parquet_src, tmp_path / "missing", *args, "--columns", "key,nope")
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1
    assert "--columns: no column 'nope' in the input (columns: key, label, weight, tokens, frames)" in missing.stderr
    assert not (tmp_path / "clash").exists() and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("max_length, dtype", [(100, "int8"), (128, "int16")])
def test_segment_ids_and_positions_take_the_smallest_type_holding_max_length(tmp_path, parquet_src, run_cli,
                                                                             max_length, dtype):
    """int8 up to L = 127, int16 up to 32,767 (int32 above), in every format; cu_seqlens stays int32 (flash-attn's);
    batchtool.load, pyarrow and TFRecord read back the same values."""
    args = ["--max-length", str(max_length), "--split-long", "--batch-size", "4", "-q"]
    for to in ("arrow", "tfrecord"):
        assert run_cli("pack", parquet_src, tmp_path / to, *args, "--to", to).exit_code == 0
    schema = read_dir(str(tmp_path / "arrow")).schema
    assert schema.field("segment_ids").type == schema.field("positions").type == pa.list_(pa.from_numpy_dtype(dtype))
    assert schema.field("cu_seqlens").type == pa.list_(pa.int32())
    for a, b in zip(batchtool.load(str(tmp_path / "arrow")), batchtool.load(str(tmp_path / "tfrecord")), strict=True):
        for name in ("segment_ids", "positions"):
            assert a[name].dtype == b[name].dtype == np.dtype(dtype) and np.array_equal(a[name], b[name])
        real = a["segment_ids"] > 0
        assert (a["positions"][real] < max_length).all() and (real.sum(axis=1) == a["length"]).all()


def test_inspect_shows_the_real_steps_of_rows_and_examples(tmp_path, parquet_src, run_cli, corpus):
    """Not the padded length every sequence column has: the rows' real steps (`length`) and the examples' (from
    cu_seqlens), the examples' exactly the input's lengths; every efficiency as a percentage."""
    dst = tmp_path / "out"
    assert run_cli("pack", parquet_src, dst, "--max-length", "512", "--pad-to-max-length", "-q").exit_code == 0
    stats = json.loads((dst / ".batchtool_manifest.json").read_text())["stats"]
    shown = run_cli("inspect", dst, "--json")
    assert shown.exit_code == 0, shown.stderr
    result = json.loads(shown.stdout)
    rows, examples = result["length"], result["example_length"]
    assert rows["column"] == "length: real steps of each row"
    assert examples["column"] == "cu_seqlens: steps of each example"
    assert rows["count"] == stats["rows"] and rows["total"] == examples["total"] == stats["real_steps"]
    assert rows["min"] < rows["max"] <= 512
    lengths = np.array([len(t) for t in corpus.column("tokens").to_pylist()])
    assert (examples["count"], examples["min"], examples["max"], examples["p50"], examples["mean"]) == \
        (300, lengths.min(), lengths.max(), int(np.percentile(lengths, 50, method="inverted_cdf")),
         round(float(lengths.mean()), 3))
    text = run_cli("inspect", dst).stdout
    assert f"lengths (length: real steps of each row): min {rows['min']}  p50 {rows['p50']}" in text
    assert f"lengths (cu_seqlens: steps of each example): min {examples['min']}  p50 {examples['p50']}" in text
    bound = stats["packing_efficiency_bound"]
    assert f"  packing_efficiency_bound: {100 * bound:.2f}%\n" in text and f"{bound}" not in text
    padded = json.loads(run_cli("inspect", dst, "--json", "--length", "tokens").stdout)["length"]
    assert padded["min"] == padded["max"] == 512  # what --length asks for: the padded steps


def test_inspect_refuses_cu_seqlens_that_are_not_packs(tmp_path, parquet_src, run_cli):
    """An example's steps come from a file: one beyond its row's real steps is an error naming file, row and column
    (it would size the histogram), not an allocation."""
    dst = tmp_path / "out"
    assert run_cli("pack", parquet_src, dst, "--max-length", "128", "--split-long", "-q").exit_code == 0
    part = dst / "part-00000.arrow"
    table = read_dir(str(dst))
    cu = table.column("cu_seqlens").combine_chunks()
    values = cu.values.to_numpy().copy()
    values[cu.offsets[3].as_py() + 1] = 1_048_576  # row 3's first example: 1,048,576 steps
    table = table.set_column(table.schema.get_field_index("cu_seqlens"), "cu_seqlens",
                             pa.ListArray.from_arrays(cu.offsets, pa.array(values)))
    with pa.OSFile(str(part), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
    result = run_cli("inspect", dst)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {part}, row 3, column 'cu_seqlens': an example of 1,048,576 steps in a "
                                     "row of ")
