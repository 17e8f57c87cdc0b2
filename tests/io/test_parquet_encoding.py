"""Parquet output dictionary-encodes only flat, non-float columns, so one huge row cannot blow up the writer; a
shard's footer is parsed once for all its row groups."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memlimit import HANG_GUARD
from batchtool.io.formats import parquet as parquet_format
from batchtool.io.formats.parquet import ParquetShardWriter, dictionary_columns
from batchtool.io.inputs import open_dataset
from batchtool.core.synthetic import make_table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dictionary_only_for_flat_columns_that_are_not_floats():
    table = make_table(50, seed=1).append_column("tag", pa.array(["a", "b"] * 25))
    assert dictionary_columns(table.schema) == ["key", "label", "tag"]
    sink = io.BytesIO()
    writer = ParquetShardWriter(sink, table.schema)
    for batch in table.to_batches(max_chunksize=20):
        writer.write(batch)
    writer.close()
    meta = pq.ParquetFile(io.BytesIO(sink.getvalue())).metadata
    for rg in range(meta.num_row_groups):
        encoded = {meta.row_group(rg).column(i).path_in_schema.split(".")[0]: meta.row_group(rg).column(i).has_dictionary_page
                   for i in range(meta.num_columns)}
        assert encoded == {"key": True, "label": True, "weight": False, "tokens": False, "frames": False, "tag": True}
    assert pq.read_table(io.BytesIO(sink.getvalue())).equals(table)


_ONE_HUGE_ROW = """
import resource, sys, numpy as np, pyarrow as pa
from batchtool.io.formats.parquet import ParquetShardWriter
n = 500_000
values = np.random.default_rng(0).standard_normal(n * 16, dtype=np.float32)
frames = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.FixedSizeListArray.from_arrays(pa.array(values), 16))
batch = pa.RecordBatch.from_arrays([pa.array(["one"]), frames], ["key", "frames"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
writer = ParquetShardWriter(open(sys.argv[1], "wb"), batch.schema)
writer.write(batch)
writer.close()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_one_row_of_8m_random_floats_is_written_in_little_extra_memory(tmp_path):
    """Dictionary-encoding this row took 530 MiB more than the 32 MB row itself; plain encoding takes
    about 200 (one page never ends inside a row: levels, the page and its compressed copy)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _ONE_HUGE_ROW, str(tmp_path / "x.parquet")], env=env,
                         capture_output=True, text=True, check=True, timeout=HANG_GUARD)
    extra_mib = int(out.stdout.strip())
    assert extra_mib < 350, f"writing one 32 MB row took {extra_mib} MiB more"


def test_a_shard_footer_is_parsed_once_for_all_its_row_groups(tmp_path, monkeypatch):
    """Opening a Parquet file parses its whole footer: per row group, a 4,000-row-group shard (batchtool's own
    outputs roll over at 4,096) cost 8.6 ms a row group instead of 0.13 ms. Local read tasks share the footer the
    dataset parsed; a task pickled for another process goes without it."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"x": np.arange(3000), "tokens": [[i] * 3 for i in range(3000)]}),
                   src / "part-0.parquet", row_group_size=10)
    dataset = open_dataset(str(src))
    parsed: list[str] = []
    open_file = parquet_format.open_file

    def counted(path, metadata=None):
        if metadata is None:
            parsed.append(path)
        return open_file(path, metadata)

    monkeypatch.setattr(parquet_format, "open_file", counted)
    tasks = list(dataset.tasks(None))
    chunks = [task() for task in tasks]
    assert len(chunks) == 300 and sum(c.num_rows for c in chunks) == 3000 and len(parsed) == 1
    shipped = pickle.loads(pickle.dumps(tasks[7]))
    assert shipped().data.equals(chunks[7].data) and len(parsed) == 2
    assert len(pickle.dumps(tasks[7])) < 2000
