"""An input column named like one batchtool uses internally is the user's data: every command keeps it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from batchtool.io.spill import ID_COLUMN
from batchtool.core.synthetic import make_table
from conftest import read_dir, write_parquet_shards

COMMANDS = {
    "convert": ["convert", "--to", "parquet"],
    "stratify": ["stratify", "--target", "uniform", "--mode", "bernoulli"],
    "stratify --balanced-batches": ["stratify", "--target", "uniform", "--replacement", "--batch-size", "8",
                                    "--balanced-batches", "--memory", "20KB"],
    "resample": ["resample", "--rate", "1.5"],
    "shuffle": ["shuffle", "--memory", "20KB"],
    "shuffle --buffer": ["shuffle", "--buffer", "50"],
    "bucket": ["bucket", "--length", "tokens", "--auto-buckets", "3", "--batch-size", "8", "--memory", "20KB"],
    "bucket --order sorted": ["bucket", "--boundaries", "30", "--batch-size", "8", "--order", "sorted"],
    "segment": ["segment", "--key", "key", "--sequence", "tokens", "--context", ID_COLUMN, "--num-unroll", "10",
                "--batch-size", "4"],
}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """300 examples with a string column named like the spill files' id column, holding unrelated values."""
    table = make_table(300, seed=3)
    table = table.append_column(ID_COLUMN, pa.array([f"user-{i}" for i in range(300)]))
    return write_parquet_shards(str(tmp_path_factory.mktemp("internal") / "src"), table)


def user_values(table: pa.Table) -> set[str]:
    """The column's values, less the empty string segment writes in empty lanes."""
    return set(table.column(ID_COLUMN).to_pylist()) - {""}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_keeps_a_column_named_like_an_internal_one(tmp_path, run_cli, src, name):
    command, *args = COMMANDS[name]
    result = run_cli(command, src, tmp_path / "out", *args, "-q")
    assert result.exit_code == 0, result.stderr
    out = read_dir(str(tmp_path / "out"))
    assert out.schema.field(ID_COLUMN).type == pa.string()
    values = user_values(out)
    assert values and values <= {f"user-{i}" for i in range(300)}
    if name in ("convert", "shuffle", "shuffle --buffer"):
        assert values == {f"user-{i}" for i in range(300)}


def test_a_pipeline_keeps_it_through_a_shuffle_and_bucket(tmp_path, run_cli, src):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'memory = "20KB"\n[input]\npath = "{src}"\n[[stage]]\nop = "shuffle"\n'
                        '[[stage]]\nop = "bucket"\nlength = "tokens"\nauto-buckets = 2\nbatch-size = 8\n'
                        f'[output]\npath = "{tmp_path / "out"}"\n')
    result = run_cli("run", pipeline, "-q")
    assert result.exit_code == 0, result.stderr
    assert user_values(read_dir(str(tmp_path / "out"))) == {f"user-{i}" for i in range(300)}
