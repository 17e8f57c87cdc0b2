"""The pipeline library: TOML keys through the commands' own options, re-keyed stage inputs, which passes read
what (and which shuffles they skip), dry runs, errors attributed to the stage that raised them."""

from __future__ import annotations

import json
import os
import pickle
import re

import numpy as np
import pyarrow as pa
import pytest
from conftest import data_bytes, write_parquet_shards

from batchtool.core.errors import BatchtoolError, InputError, UsageError
from batchtool.core.run_settings import RunSettings
from batchtool.ops.bucket import BucketOptions
from batchtool.ops.segment import SegmentOptions
from batchtool.ops.stratify import StratifyOptions
from batchtool.pipeline import execute, load, run_pipeline
from batchtool.ops.rename import RenameOptions
from batchtool.pipeline.stages import Stage
from batchtool.core.synthetic import make_table
from batchtool.core.runner import Threads

RUN = RunSettings(threads=2, quiet=True)


def pipeline(tmp_path, stages: list[str], top: str = "", src: str = "src", output: str = "") -> str:
    body = "\n".join(f"[[stage]]\n{s}\n" for s in stages)
    path = tmp_path / "p.toml"
    path.write_text(f'{top}\n[input]\npath = "{src}"\n{body}\n[output]\npath = "out"\n{output}\n')
    return str(path)


def test_keys_are_the_commands_flags_with_their_types_and_defaults(tmp_path):
    config = load(pipeline(tmp_path, [
        'op = "stratify"\ntarget = {0 = 0.5, 3 = 0.5}\nbatch-size = 8',
    ], top='seed = 7\nthreads = 3\nmemory = "2MB"\ntmp-dir = "spills"'))
    options = config.stages[0].options
    assert options == StratifyOptions(target={0: 0.5, 3: 0.5}, batch_size=8)
    assert (config.seed, config.threads, config.input.path) == (7, 3, str(tmp_path / "src"))
    assert (config.memory, config.tmp_dir) == (2 << 20, str(tmp_path / "spills"))
    assert config.output_path == str(tmp_path / "out") and config.output.codec == "zstd"


def test_stratify_keys_come_from_its_schema_and_errors_name_keys(tmp_path):
    config = load(pipeline(tmp_path, ['op = "stratify"\ntarget = [0.5, 0.5]\nmode = "bernoulli"\n'
                                      'init-probs = "0.25,0.75"']))
    assert config.stages[0].options == StratifyOptions(target=(0.5, 0.5), mode="bernoulli", init_probs=(0.25, 0.75))
    for keys, message in [('target = "uniform"\nbalanced-batches = true', "balanced-batches needs batch-size"),
                          ('target = [0.5, 0.6]', "key 'target' = 0.5,0.6: probabilities sum to 1.1"),
                          ('target = "uniform"\nnum-classes = 0', "key 'num-classes' = 0: must be at least 1"),
                          ('target = "uniform"\ninit-probs = true', "key 'init-probs': expected a list of "
                                                                     "probabilities or a string, got boolean True")]:
        with pytest.raises(UsageError, match=re.escape(f"stage 1 (stratify): {message}")):
            load(pipeline(tmp_path, [f'op = "stratify"\n{keys}']))


def test_lists_tables_and_negated_flags(tmp_path):
    config = load(pipeline(tmp_path, [
        ('op = "segment"\nkey = "key"\nsequence = ["tokens", "frames"]\nnum-unroll = 4\nbatch-size = 2\n'
        'no-pad = true\npad-value = {tokens = -1}'),
    ], output='format = "tfrecord"\nshard-bytes = "1MB"'))
    assert config.stages[0].options == SegmentOptions(key="key", sequence=("tokens", "frames"), num_unroll=4,
                                                      batch_size=2, pad=False, pad_value=("tokens=-1",))
    assert (config.output.format, config.output.shard_bytes) == ("tfrecord", 1 << 20)
    bucket = load(pipeline(tmp_path, [('op = "bucket"\nboundaries = [8, 16]\nbatch-size = [4, 2, 1]\n'
                                      'sequence = "tokens"')]))
    assert bucket.stages[0].options == BucketOptions(boundaries=(8, 16), batch_size=(4, 2, 1), sequence=("tokens",))
    rename = load(pipeline(tmp_path, ['op = "rename"\ncolumns = ["label=class", "key = id"]']))
    assert rename.stages[0].options == RenameOptions((("label", "class"), ("key", "id")))


def test_manifest_records_the_pipeline(tmp_path, parquet_src):
    path = pipeline(tmp_path, ['op = "resample"\nrate = 2.0'], src=parquet_src, top="seed = 3\nthreads = 1")
    result = run_pipeline(load(path), RUN)
    m = result.manifest
    assert m["command"] == "run" and m["seed"] == 3
    assert m["options"]["stages"] == [{"op": "resample", "rate": 2.0}]
    assert m["options"]["pipeline"] == os.path.abspath(path)
    assert [f["path"] for f in m["inputs"]["files"]] == sorted(
        os.path.join(parquet_src, f) for f in os.listdir(parquet_src))
    stage = m["stats"]["stages"][0]
    assert stage["rows_in"] == 300 and stage["rows_out"] == m["output"]["rows"] == m["stats"]["rows_out"]
    assert stage["mode"] == "rate" and stage["rate"]["mean"] == 2.0


def test_stage_inputs_are_rekeyed_row_numbers_and_read_back_as_from_parquet(tmp_path, parquet_src, monkeypatch):
    config = load(pipeline(tmp_path, ['op = "resample"\nrate = 1.5', 'op = "rename"\ncolumns = ["label=class"]'],
                           src=parquet_src))
    seen: dict[str, object] = {}

    def spy(op, plan, regroups, runtime, *args):
        view = runtime.data
        chunks = list(view.chunks(executor=Threads(2)))
        seen.update(ids=np.concatenate([c.ids for c in chunks]), first=chunks[0].data, view=view)
        raise InputError("stop here")

    monkeypatch.setattr(execute, "produced", spy)
    with pytest.raises(BatchtoolError, match="stage 2 .rename.: stop here"):
        run_pipeline(config, RUN)
    ids = seen["ids"]
    assert ids.tolist() == list(range(len(ids)))
    first = seen["first"]  # read back as the next command would: re-reading changes nothing
    assert first.nbytes == execute.reread(first).nbytes and first.equals(execute.reread(first))
    assert seen["view"].locate(5) == f"{config.path}: stage 2 (rename) input, row 5"
    remote = pickle.loads(pickle.dumps(seen["view"]))  # what a remote engine's worker gets: no run state
    assert remote.prefix is None and remote.locate(5) == seen["view"].locate(5)


def materializations(monkeypatch) -> list:
    """The columns of every regrouping of a barrier (None: all of them), as the run makes them."""
    calls = []
    original = execute.Prefix._regroup

    def counting(self, j, stage, upstream, like):
        calls.append(None if upstream.scope is None else sorted(upstream.scope))
        return original(self, j, stage, upstream, like)

    monkeypatch.setattr(execute.Prefix, "_regroup", counting)
    return calls


def test_a_shuffle_is_skipped_by_first_passes_that_ignore_order(tmp_path, parquet_src, monkeypatch):
    """shuffle -> bucket: bucket's length histogram does not depend on order, so only the main run spills."""
    calls = materializations(monkeypatch)
    run_pipeline(load(pipeline(tmp_path, ['op = "shuffle"', 'op = "bucket"\nauto-buckets = 2\nbatch-size = 8'],
                               src=parquet_src)), RUN)
    assert calls == [None]


def test_a_shuffle_is_spilled_narrowly_for_passes_that_depend_on_ids(tmp_path, parquet_src, monkeypatch):
    """shuffle -> stratify (exact: thresholds of keyed hashes of ids) -> bucket: the label column is shuffled for
    stratify's passes, label and tokens for bucket's (stratify's selection depends on the ids), all for the run."""
    calls = materializations(monkeypatch)
    run_pipeline(load(pipeline(tmp_path, ['op = "shuffle"', 'op = "stratify"\ntarget = "uniform"',
                                          'op = "bucket"\nauto-buckets = 2\nbatch-size = 8'], src=parquet_src)), RUN)
    assert calls == [["label"], ["label", "tokens"], None]


def test_threads_and_seeds(tmp_path, parquet_src):
    stages = ['op = "stratify"\ntarget = "uniform"\nmode = "bernoulli"\nreplacement = true', 'op = "shuffle"',
              'op = "bucket"\nauto-buckets = 3\nbatch-size = 16']
    outs = {}
    for seed, threads in ((1, 1), (1, 4), (2, 2)):
        path = pipeline(tmp_path, stages, src=parquet_src, top=f"seed = {seed}", output="overwrite = true")
        run_pipeline(load(path), RunSettings(threads=threads, quiet=True))
        outs[seed, threads] = data_bytes(str(tmp_path / "out"))
    assert outs[1, 1] == outs[1, 4] != outs[2, 2]


def test_dry_run_reports_plans_and_writes_nothing(tmp_path, parquet_src):
    path = pipeline(tmp_path, [('op = "stratify"\ntarget = [0.5, 0.5]\nnum-classes = 2\nmode = "bernoulli"\n'
                               'init-probs = [0.9, 0.1]'),
                               'op = "segment"\nkey = "key"\nsequence = "tokens"\nnum-unroll = 10\nbatch-size = 4'],
                    src=str(write_parquet_shards(str(tmp_path / "two"), two_classes(), shards=2)))
    result = run_pipeline(load(path), RUN, dry_run=True)
    assert not os.path.exists(tmp_path / "out")
    strat, seg = result.stages
    assert strat["rows_in"] == 200 and strat["acceptance_probs"] == pytest.approx([1 / 9, 1.0])
    assert seg["rows_in"] == strat["rows_out"] and seg["segments"] >= seg["rows_in"]
    assert seg["batches"] == -(-seg["segments"] // 4) and 0 < seg["padding_efficiency"] <= 1


def two_classes() -> pa.Table:
    table = make_table(200, seed=3)
    labels = (np.arange(200) % 10 == 0).astype(np.int64)
    return table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))


def test_errors_name_the_stage_that_raised_them(tmp_path, parquet_src):
    """A bad label found while stratify streams (no counting pass) is stratify's error, not the last stage's."""
    path = pipeline(tmp_path, ['op = "stratify"\ntarget = "uniform"\nmode = "online"\nnum-classes = 3',
                               'op = "bucket"\nauto-buckets = 2\nbatch-size = 8'], src=parquet_src)
    with pytest.raises(BatchtoolError) as err:
        run_pipeline(load(path), RUN)
    message = str(err.value)
    assert message.startswith(f"{path}: stage 1 (stratify): ") and "stage 2" not in message
    assert "label(s) are not integers in [0, 3)" in message
    assert not os.path.exists(tmp_path / "out")


def test_stats_of_every_stage_in_the_manifest(tmp_path, parquet_src):
    path = pipeline(tmp_path, ['op = "stratify"\ntarget = "uniform"', 'op = "resample"\nrate = 2.0',
                               'op = "bucket"\nauto-buckets = 2\nbatch-size = 8'], src=parquet_src)
    result = run_pipeline(load(path), RUN)
    stats = result.manifest["stats"]
    stratify, resample, bucket = stats["stages"]
    assert stratify["class_counts_after"] == {str(c): 3 for c in range(4)}
    assert stratify["rows_out"] == 12 == resample["rows_in"]
    assert resample["rows_out"] == bucket["rows_in"] == bucket["rows_out"]
    assert stats["padding_efficiency"] == bucket["padding_efficiency"] > 0
    assert json.loads(json.dumps(stats)) == stats


def test_a_stage_is_its_op_and_asking_it_changes_nothing(tmp_path, parquet_src):
    """Every stage member is the op's answer for the stage's options; schemas and columns are pure questions."""
    config = load(pipeline(tmp_path, ['op = "shuffle"', 'op = "resample"\nrate = 2.0',
                                      'op = "bucket"\nauto-buckets = 2\nbatch-size = 8'], src=parquet_src))
    stages = [Stage(c, config.seed) for c in config.stages]
    assert [(s.name, s.op.name, s.barrier) for s in stages] == [
        ("stage 1 (shuffle)", "shuffle", True), ("stage 2 (resample)", "resample", False),
        ("stage 3 (bucket)", "bucket", False)]
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("label", pa.int64())])
    for stage in stages:
        before = dict(vars(stage))
        stage.output_schema(schema), stage.input_columns(["tokens"]), stage.first_pass(schema), stage.sensitivity
        assert vars(stage) == before


def test_the_engine_is_chosen_once_by_the_entry_point(tmp_path, parquet_src, run_cli, monkeypatch):
    """run_options only makes RunSettings: every command's executor is opened by its entry point (engines.executor),
    once per command, with the settings it was given, `run` and `inspect` too."""
    from batchtool.exec import engines
    scopes: list[tuple[str, int]] = []
    real = engines.executor

    def counting(run):
        scopes.append((run.engine, run.threads))
        return real(run)

    for module in ("exec.driver", "exec.convert", "exec.inspection", "pipeline.execute", "check.evaluate"):
        monkeypatch.setattr(f"batchtool.{module}.run_executor", counting)
    path = pipeline(tmp_path, ['op = "shuffle"'], src=parquet_src)
    for args in (["inspect", parquet_src], ["convert", parquet_src, tmp_path / "c"],
                 ["shuffle", parquet_src, tmp_path / "s"], ["run", path]):
        scopes.clear()
        result = run_cli(*args, "--threads", "3", "-q")
        assert result.exit_code == 0, result.stderr
        assert scopes == [("local", 3)], args
